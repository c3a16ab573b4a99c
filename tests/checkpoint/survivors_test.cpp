// The survivors' state (checkpoint.h, write_survivor / adopt_survivors): three fake ranks of
// a two-replica layout write what they hold, one replica's files are lost, and the rest
// becomes the committed checkpoint of its step, read back bitwise; incomplete sets, and sets
// past the last step the run's log holds, are left, saying why; older ones go.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint_test_util.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

using checkpoint_test_util::bitwise_equal;
using checkpoint_test_util::CheckpointTest;

class SurvivorsTest : public CheckpointTest {
 protected:
  // Ranks 0 and 1 hold a_ split in two along dim 0 and c_ whole; ranks 2 and 3 are their
  // data-parallel replicas (the same shards). `ranks`: which of them write.
  void write_survivors(int64_t step, const std::vector<int>& ranks, const std::string& tag) {
    for (int r : ranks) {
      std::vector<std::vector<float>> keep;
      keep.reserve(4);
      const int half = r % 2;
      std::vector<ShardData> shards = {shard(a_, 0, 4 * half, 4, keep)};
      if (half == 0) shards.push_back(shard(c_, -1, 0, 5, keep));
      Manifest base;
      base.step = step;
      base.optimizer_steps = step;
      base.samples = 4 * step;
      base.layout = Layout{4, 2, 2, 1, 1, false};
      base.recipe_toml = "[model]\nd_model = 6\n";
      base.tensors = 2;
      write_survivor(root_, r, tag, base, shards);
    }
  }
  bool said(const std::vector<std::string>& lines, const std::string& text) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }
};

TEST_F(SurvivorsTest, AReplicaOfEveryShardMakesTheCommittedCheckpointOfItsStep) {
  write_survivors(13, {0, 3}, "job");  // ranks 1 and 2 died: 3 holds 1's half
  const std::vector<std::string> lines = adopt_survivors(root_);
  ASSERT_TRUE(said(lines, "step 13 adopted")) << ::testing::PrintToString(lines);
  const std::vector<std::string> committed = committed_checkpoints(root_);
  ASSERT_EQ(committed.front(), checkpoint_dir(root_, 13));
  EXPECT_FALSE(fs::exists(survivors_dir(root_, 13, "job")));
  Reader reader(committed.front());
  const Manifest& m = reader.manifest();
  EXPECT_EQ(m.step, 13);
  EXPECT_EQ(m.samples, 52);
  EXPECT_EQ(m.tensors, -1);
  EXPECT_EQ(m.shards.size(), 3u);  // a_'s two halves and c_, each once
  EXPECT_EQ(reader.verify_all(), 3);
  std::vector<float> got(a_.data.size());
  reader.read(a_.name, a_.shape, -1, 0, a_.shape, got.data());
  EXPECT_TRUE(bitwise_equal(got, a_.data));
}

TEST_F(SurvivorsTest, AShardWithoutAReplicaLeftIsNotAdoptedAndOlderStatesGo) {
  write_survivors(10, {0, 1}, "first");  // adopted: the newest committed checkpoint
  ASSERT_EQ(adopt_survivors(root_).size(), 1u);
  write_survivors(8, {0, 1}, "old");    // older than step 10: goes
  write_survivors(13, {0, 2}, "job");   // ranks 1 and 3 died: a_'s second half is gone
  write_survivors(14, {1}, "partial");  // c_ was with ranks 0 and 2: no tensor count reached
  const std::vector<std::string> lines = adopt_survivors(root_);
  EXPECT_TRUE(said(lines, "do not hold everything")) << ::testing::PrintToString(lines);
  EXPECT_TRUE(said(lines, "hold 1 tensors of 2")) << ::testing::PrintToString(lines);
  EXPECT_EQ(committed_checkpoints(root_).front(), checkpoint_dir(root_, 10));
  EXPECT_FALSE(fs::exists(survivors_dir(root_, 8, "old")));
  EXPECT_TRUE(fs::exists(survivors_dir(root_, 13, "job")));  // left, until a checkpoint passes it
  // A rank file whose manifest was never written (the rank was killed while writing) counts
  // for nothing.
  fs::remove(survivors_dir(root_, 13, "job") + "/rank-00000.base.json");
  EXPECT_TRUE(said(adopt_survivors(root_), "hold 1 tensors of 2"));
}

// The run's log ends at step 12 (the rank writing it was between its optimizer step and the
// row when the job ended): the survivors of step 13 are not adopted, saying so, and stay;
// once the log holds step 13 they are.
TEST_F(SurvivorsTest, NoneAdoptedPastTheLastStepLogged) {
  write_survivors(13, {0, 1}, "job");
  EXPECT_TRUE(said(adopt_survivors(root_, 12), "the run's log ends at step 12"));
  EXPECT_TRUE(committed_checkpoints(root_).empty());
  EXPECT_TRUE(said(adopt_survivors(root_, 13), "step 13 adopted"));
}

}  // namespace
}  // namespace pentad::ckpt
