// Checkpoints' commit (checkpoint/checkpoint.h): listing newest first and retention, retired
// directories handed back for deletion, rank files recycled to the same bytes, uncommitted
// directories ignored, a step committed again replaced, and holes refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint_test_util.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

using checkpoint_test_util::bitwise_equal;
using checkpoint_test_util::CheckpointTest;
using checkpoint_test_util::Global;
using checkpoint_test_util::make_tensor;

TEST_F(CheckpointTest, ListsNewestFirstAndKeepsTheLastTwo) {
  EXPECT_TRUE(committed_checkpoints(root_).empty());  // root does not exist yet
  save(5, 2);
  write_ranks(7);  // a crash before commit leaves a .partial directory behind
  save(10, 2);
  EXPECT_FALSE(fs::exists(partial_dir(root_, 7))) << "stale: older than the step committed";
  EXPECT_EQ(committed_checkpoints(root_).size(), 2u);
  write_ranks(30);  // an in-flight save of a later step must survive the commit of 20
  save(20, 2);
  EXPECT_EQ(committed_checkpoints(root_),
            (std::vector<std::string>{checkpoint_dir(root_, 20), checkpoint_dir(root_, 10)}));
  EXPECT_FALSE(fs::exists(checkpoint_dir(root_, 5)));
  EXPECT_TRUE(fs::exists(partial_dir(root_, 30)));

  // Ordering is numeric, beyond 8 digits too; keep_last 0 keeps everything.
  save(123456789, 0);
  save(99, 0);
  EXPECT_EQ(committed_checkpoints(root_),
            (std::vector<std::string>{checkpoint_dir(root_, 123456789), checkpoint_dir(root_, 99),
                                      checkpoint_dir(root_, 20), checkpoint_dir(root_, 10)}));
}

TEST_F(CheckpointTest, CommitRetiresOldDirectoriesForLaterDeletion) {
  save(5, 1);
  write_ranks(10);
  Manifest m;
  m.step = 10;
  std::vector<std::string> retired = commit(root_, m, 1);
  // Step 5 is out of every listing at once, and still on disk until the caller deletes it.
  EXPECT_EQ(retired, (std::vector<std::string>{checkpoint_dir(root_, 5) + ".deleting"}));
  EXPECT_EQ(committed_checkpoints(root_), (std::vector<std::string>{checkpoint_dir(root_, 10)}));
  EXPECT_FALSE(fs::exists(checkpoint_dir(root_, 5)));
  EXPECT_TRUE(fs::exists(retired[0] + "/manifest.json"));
  // A retired directory a run left behind (killed before deleting it) is handed back by
  // the next commit, with what that commit retires.
  write_ranks(20);
  m.step = 20;
  retired = commit(root_, m, 1);
  std::sort(retired.begin(), retired.end());
  EXPECT_EQ(retired, (std::vector<std::string>{checkpoint_dir(root_, 5) + ".deleting",
                                               checkpoint_dir(root_, 10) + ".deleting"}));
  remove_dirs(retired);
  for (const std::string& dir : retired) EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(committed_checkpoints(root_), (std::vector<std::string>{checkpoint_dir(root_, 20)}));
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// checkpoint.recycle_files: retired rank files wait in <root>/recycled, and the next file of
// the same rank is written over one: byte for byte the file a fresh write gives, whatever
// the recycled file held and whatever its size.
TEST_F(CheckpointTest, RecycledFilesAreRewrittenToTheSameBytes) {
  std::vector<std::vector<float>> keep;
  const Global big = make_tensor("param/big", Shape{300, 200}, 5);  // aligned, direct I/O
  const std::vector<ShardData> shards = {shard(a_, -1, 0, 0, keep), shard(big, -1, 0, 0, keep),
                                         shard(c_, -1, 0, 0, keep)};
  const std::string fresh = root_ + "/fresh/" + rank_file_name(0);
  write_rank_file(fresh, shards);
  const std::string expected = file_bytes(fresh);
  ASSERT_GT(expected.size(), size_t{240000});

  const std::string pool = recycle_dir(root_);
  const std::string pooled = pool + "/" + rank_file_name(0);
  for (size_t old_bytes : {expected.size() + (1 << 20), size_t{10000}}) {  // larger, smaller
    fs::create_directories(pool);
    std::ofstream(pooled, std::ios::binary) << std::string(old_bytes, '\xab');
    const std::string path = partial_dir(root_, 7) + "/" + rank_file_name(0);
    EXPECT_TRUE(write_rank_file(path, shards, true, /*recycle=*/true));
    EXPECT_FALSE(fs::exists(pooled)) << "the recycled file was not taken";
    EXPECT_TRUE(file_bytes(path) == expected) << "old bytes " << old_bytes;
    fs::remove_all(partial_dir(root_, 7));
  }
  // Without a recycled file it writes a fresh one.
  EXPECT_FALSE(
      write_rank_file(partial_dir(root_, 8) + "/" + rank_file_name(0), shards, true, true));
  EXPECT_TRUE(file_bytes(partial_dir(root_, 8) + "/" + rank_file_name(0)) == expected);

  // Retired directories hand their rank files to the pool; the rest goes.
  fs::remove_all(pool);
  save(5, 1);
  write_ranks(6);
  Manifest m;
  m.step = 6;
  const std::vector<std::string> retired = commit(root_, m, 1);
  ASSERT_EQ(retired, (std::vector<std::string>{checkpoint_dir(root_, 5) + ".deleting"}));
  pool_rank_files(retired);
  remove_dirs(retired);
  EXPECT_FALSE(fs::exists(retired[0]));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(fs::exists(pool + "/" + rank_file_name(r))) << r;
  EXPECT_EQ(committed_checkpoints(root_), (std::vector<std::string>{checkpoint_dir(root_, 6)}));
}

TEST_F(CheckpointTest, IgnoresUncommittedDirectories) {
  save(3);
  write_ranks(4);                                    // crashed before commit
  fs::create_directories(checkpoint_dir(root_, 6));  // no manifest
  std::ofstream(root_ + "/step-00000009") << "a file, not a directory";
  fs::create_directories(root_ + "/step-1x");
  EXPECT_EQ(committed_checkpoints(root_), (std::vector<std::string>{checkpoint_dir(root_, 3)}));
  // The directory without its manifest is listed apart, for a warning that names it.
  EXPECT_EQ(checkpoints_without_manifest(root_),
            (std::vector<std::string>{checkpoint_dir(root_, 6)}));
}

TEST_F(CheckpointTest, RecommitReplacesTheStep) {
  save(8);
  a_.data[5] = 1234.5f;  // the re-run after a resume computed something else
  save(8, 2);
  EXPECT_EQ(committed_checkpoints(root_), (std::vector<std::string>{checkpoint_dir(root_, 8)}));
  EXPECT_FALSE(fs::exists(checkpoint_dir(root_, 8) + ".replaced"));
  Reader r(checkpoint_dir(root_, 8));
  std::vector<float> got(a_.data.size());
  r.read(a_.name, a_.shape, -1, 0, a_.shape, got.data());
  EXPECT_TRUE(bitwise_equal(got, a_.data));
}

TEST_F(CheckpointTest, CommitRefusesHoles) {
  std::vector<float> half(24, 1.0f);
  write_rank_file(
      partial_dir(root_, 1) + "/" + rank_file_name(0),
      {ShardData{ShardInfo{"param/a", Shape{8, 6}, 0, 0, Shape{4, 6}, 0}, half.data()}});
  Manifest m;
  m.step = 1;
  const std::string message = error_of([&] { remove_dirs(commit(root_, m, 0)); });
  EXPECT_NE(message.find("param/a rows [4, 8) along dim 0"), std::string::npos) << message;
  EXPECT_TRUE(committed_checkpoints(root_).empty());
}

}  // namespace
}  // namespace pentad::ckpt
