// The asynchronous saver: an optimizer that overwrites the live state right behind
// wait_for_copy(begin, end) never changes what the snapshot holds; the file it writes
// (direct I/O from the page-aligned staging buffer, odd sizes included) reads back bitwise
// with the checksums computed during the copy; and restore() brings the newest snapshot
// back from memory.
#include "checkpoint/saver.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checksum.h"
#include "checkpoint/memory_level.h"
#include "core/check.h"
#include "tests/fast_random.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

struct State {
  std::vector<std::vector<float>> tensors;
  std::vector<LiveTensor> live() {
    std::vector<LiveTensor> out;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto n = static_cast<int64_t>(tensors[i].size());
      out.push_back({ShardInfo{"param/t" + std::to_string(i), Shape{n}, -1, 0, Shape{n}, 0},
                     tensors[i].data()});
    }
    return out;
  }
};

// Copies values into the live buffers (which the saver points at) in place.
void overwrite(State& s, const State& with) {
  for (size_t i = 0; i < s.tensors.size(); ++i)
    std::copy(with.tensors[i].begin(), with.tensors[i].end(), s.tensors[i].begin());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Several tens of MB (the copy takes milliseconds), sizes that are not whole pages.
State make_state(uint32_t seed) {
  State s;
  uint64_t stream = uint64_t{seed} << 8;
  for (size_t n :
       {size_t{3}, size_t{5'000'001}, size_t{1023}, size_t{4'000'000}, size_t{2'999'999}})
    s.tensors.push_back(fast_random(n, stream++));
  return s;
}

class SaverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        (fs::temp_directory_path() / fmt::format("pentad-saver-{}-{}", ::getpid(), info->name()))
            .string();
    fs::remove_all(root_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  // Commits the saver's file as a checkpoint and reads every tensor back.
  std::vector<std::vector<float>> read_back(const State& like, int64_t step) {
    Manifest m;
    m.step = step;
    remove_dirs(commit(root_, m, 0));
    Reader r(checkpoint_dir(root_, step));
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < like.tensors.size(); ++i) {
      const Shape shape{static_cast<int64_t>(like.tensors[i].size())};
      out.emplace_back(like.tensors[i].size());
      r.read("param/t" + std::to_string(i), shape, -1, 0, shape, out.back().data());
      EXPECT_EQ(r.manifest().shards.at(i).shard.checksum,
                XXH3_64bits(like.tensors[i].data(), like.tensors[i].size() * sizeof(float)));
    }
    EXPECT_EQ(r.verify_all(), static_cast<int64_t>(like.tensors.size()));
    return out;
  }

  std::string file(int64_t step) { return partial_dir(root_, step) + "/" + rank_file_name(0); }

  std::string root_;
};

TEST_F(SaverTest, OverwritingBehindTheCopyKeepsTheSnapshot) {
  State state = make_state(1);
  const State original = state;
  AsyncSaver saver;
  saver.begin({file(1)}, state.live(), true);
  // The optimizer's pattern: in order, chunk by chunk, wait then overwrite. A wait that
  // returned early would let the poison into the file.
  constexpr size_t kChunk = 100'000;
  float unrelated[16] = {};
  saver.wait_for_copy(unrelated, unrelated + 16);  // memory it does not hold: no wait
  for (std::vector<float>& t : state.tensors)
    for (size_t at = 0; at < t.size(); at += kChunk) {
      const size_t end = std::min(t.size(), at + kChunk);
      saver.wait_for_copy(t.data() + at, t.data() + end);
      std::fill(t.begin() + static_cast<std::ptrdiff_t>(at),
                t.begin() + static_cast<std::ptrdiff_t>(end), -1.0f);
    }
  // Every chunk was waited for, but the copy may still be running: each wait returns as
  // soon as its piece is published, and the copy ends only after the last tensor's checksum
  // and its bookkeeping. (Asserting !copying() before this wait failed once under ASan.)
  saver.wait_for_copy();
  EXPECT_FALSE(saver.copying());
  saver.wait_for_file();
  const auto got = read_back(original, 1);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], original.tensors[i])) << "tensor " << i;
  const AsyncSaver::Timings t = saver.last_timings();
  EXPECT_GT(t.copy_seconds, 0.0);
  EXPECT_GT(t.write_seconds, 0.0);
}

// A frozen snapshot (checkpoint.snapshot = "swap") is written from where it lies, with
// no staging buffer and nothing to wait for; the file holds the same bits, and reserve()
// makes the copy's staging buffer ahead of the first save.
TEST_F(SaverTest, FrozenSnapshotWritesInPlaceAndMatchesTheCopy) {
  const State state = make_state(4);
  State frozen = state;
  AsyncSaver saver;
  saver.begin({file(1)}, frozen.live(), true, /*frozen=*/true);
  EXPECT_FALSE(saver.copying());  // nothing for an optimizer to wait for
  saver.wait_for_file();
  EXPECT_EQ(saver.staging_bytes(), 0u);
  EXPECT_ANY_THROW(saver.restore());  // the owner keeps a frozen snapshot, not the saver
  const auto got = read_back(state, 1);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], state.tensors[i])) << "tensor " << i;

  State copied = state;
  AsyncSaver copier;
  copier.reserve(copied.live());
  const size_t reserved = copier.staging_bytes();
  EXPECT_GE(reserved, 12'000'026 * sizeof(float));
  copier.begin({file(2)}, copied.live(), true);
  copier.wait_for_file();
  EXPECT_EQ(copier.staging_bytes(), reserved) << "the save used the reserved buffer";
  const auto again = read_back(state, 2);
  for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(same_bits(again[i], got[i]));
}

TEST_F(SaverTest, RestoreBringsBackTheNewestSnapshot) {
  const State first = make_state(2), second = make_state(3);
  State state = first;
  AsyncSaver saver;
  EXPECT_FALSE(saver.restore());  // nothing saved yet
  saver.begin({file(1)}, state.live(), true);
  saver.wait_for_copy();
  overwrite(state, second);  // training goes on
  // Restore while the write may still run, then again after it.
  ASSERT_TRUE(saver.restore());
  for (size_t i = 0; i < state.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(state.tensors[i], first.tensors[i])) << "tensor " << i;
  saver.wait_for_file();
  overwrite(state, second);
  ASSERT_TRUE(saver.restore());
  for (size_t i = 0; i < state.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(state.tensors[i], first.tensors[i])) << "tensor " << i;

  // A newer snapshot replaces it (synchronous: copied and written when begin returns).
  overwrite(state, second);
  saver.begin({file(2)}, state.live(), false);
  EXPECT_FALSE(saver.copying());
  EXPECT_TRUE(saver.file_done());
  overwrite(state, first);
  ASSERT_TRUE(saver.restore());
  for (size_t i = 0; i < state.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(state.tensors[i], second.tensors[i])) << "tensor " << i;
  saver.wait_for_file();
  const auto got = read_back(second, 2);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], second.tensors[i])) << "tensor " << i;
}

// One level that cannot be written (a full disk, here a path under a regular file) costs
// the other level nothing: each file's error is its own.
TEST_F(SaverTest, AFailedLevelDoesNotStopTheOthers) {
  State state;
  state.tensors = {std::vector<float>(1000, 1.5f), std::vector<float>(7, -2.0f)};
  fs::create_directories(root_);
  std::ofstream(root_ + "/blocker") << "x";
  const std::string bad = root_ + "/blocker/step-00000001.partial/" + rank_file_name(0);
  const std::string good = partial_dir(root_, 1) + "/" + rank_file_name(0);
  for (const std::vector<std::string>& files :
       {std::vector<std::string>{bad, good}, std::vector<std::string>{good, bad}}) {
    fs::remove_all(partial_dir(root_, 1));
    AsyncSaver saver;
    saver.begin(files, state.live(), true);
    EXPECT_THROW(saver.wait_for_file(), Error);
    const std::vector<std::string>& errors = saver.file_errors();
    ASSERT_EQ(errors.size(), 2u);
    const size_t bad_at = files[0] == bad ? 0 : 1;
    EXPECT_NE(errors[bad_at].find(bad), std::string::npos) << errors[bad_at];
    EXPECT_EQ(errors[1 - bad_at], "");
    EXPECT_TRUE(fs::exists(good));
  }
  const std::vector<std::vector<float>> got = read_back(state, 1);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], state.tensors[i]));
}

// checkpoint.recycle_files: the remover moves a retired rank file to the pool before it
// deletes anything, and the next file this saver writes waits for that, then is written
// over it (threads: the remover's and the writer's; run under TSan).
TEST_F(SaverTest, NextFileIsWrittenOverTheRetiredOne) {
  const State first = make_state(2), second = make_state(3);
  State live = first;
  AsyncSaver saver;
  saver.set_recycling(true);
  saver.begin({file(1)}, live.live(), true);
  saver.wait_for_file();
  const std::string retired = checkpoint_dir(root_, 1) + ".deleting";
  fs::rename(partial_dir(root_, 1), retired);  // as commit() retires a checkpoint
  saver.remove_later({retired});
  live = second;
  saver.begin({file(2)}, live.live(), true);  // at once: the writer waits for the pool
  saver.wait_for_file();
  saver.wait_for_removal();
  EXPECT_EQ(saver.recycled_files(), 1);
  EXPECT_FALSE(fs::exists(retired));
  EXPECT_FALSE(fs::exists(recycle_dir(root_) + "/" + rank_file_name(0)));
  const auto got = read_back(second, 2);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], second.tensors[i])) << "tensor " << i;
}

TEST_F(SaverTest, RemovesRetiredDirectoriesInTheBackground) {
  std::vector<std::string> dirs;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(fmt::format("{}/step-{:08d}.deleting", root_, i));
    fs::create_directories(dirs.back() + "/sub");
    std::ofstream(dirs.back() + "/sub/rank-00000.h5") << "data";
  }
  AsyncSaver saver;
  saver.remove_later({dirs[0], dirs[1]});
  saver.remove_later({dirs[2]});  // waits for the first batch
  saver.wait_for_removal();
  for (const std::string& dir : dirs) EXPECT_FALSE(fs::exists(dir)) << dir;
  saver.remove_later({root_ + "/no-such-directory"});  // errors cost space only
  saver.wait_for_removal();
}

// The in-memory level (memory_level.h): snapshots in two slots that another process (here a
// second MemoryLevel on the same files) finds and loads bitwise; the slot a snapshot is
// copied into loses its index first, so a process that dies mid-copy leaves the other slot;
// a damaged or other-layout slot is refused, naming the file and tensor, writing nothing.
TEST_F(SaverTest, MemoryLevelOutlivesItsProcess) {
  fs::create_directories(root_);
  const std::string prefix = MemoryLevel::prefix_for(root_, root_ + "/checkpoints", 3);
  EXPECT_NE(prefix.find("-rank-00003"), std::string::npos) << prefix;
  EXPECT_EQ(prefix, MemoryLevel::prefix_for(root_, root_ + "/./checkpoints", 3));
  auto small = [](uint32_t seed) {
    State s;
    uint64_t stream = uint64_t{seed} << 8;
    for (size_t n : {size_t{3}, size_t{300'001}, size_t{1023}, size_t{4096}})
      s.tensors.push_back(fast_random(n, stream++));
    return s;
  };
  auto manifest = [](int64_t step) {
    Manifest m;
    m.step = step;
    m.optimizer_steps = step;
    m.samples = 8 * step;
    return m;
  };
  State live = small(1);
  const State first = live, second = small(2), third = small(3);
  {
    MemoryLevel level(prefix);
    level.reserve(live.live());
    EXPECT_EQ(level.staging_bytes(), 2 * sizeof(float) * (1024 + 300032 + 1024 + 4096));
    level.take(manifest(1), live.live(), true);
    for (size_t i = 0; i < live.tensors.size(); ++i) {  // the optimizer, behind the copy
      std::vector<float>& t = live.tensors[i];
      level.wait_for_copy(t.data(), t.data() + t.size());
      t = second.tensors[i];
    }
    level.settle();
    level.take(manifest(2), live.live(), true);
    level.settle();
    // A third snapshot goes into step 1's slot: its index is gone before the copy starts.
    overwrite(live, third);
    level.take(manifest(3), live.live(), true);
    const auto during = MemoryLevel(prefix).held();
    ASSERT_FALSE(during.empty());
    for (const auto& h : during) EXPECT_NE(h.manifest.step, 1);
    level.settle();
  }
  MemoryLevel later(prefix);  // the next process
  const auto held = later.held();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].manifest.step, 3);
  EXPECT_EQ(held[1].manifest.step, 2);
  EXPECT_EQ(held[1].manifest.samples, 16);
  State got = small(9);
  later.load(held[1].slot, got.live());
  for (size_t i = 0; i < got.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(got.tensors[i], second.tensors[i])) << "tensor " << i;
  later.load(held[0].slot, got.live());
  for (size_t i = 0; i < got.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(got.tensors[i], third.tensors[i])) << "tensor " << i;

  // A damaged slot: refused, naming the tensor; nothing written.
  {
    std::fstream f(later.data_file(held[1].slot), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 4 * 1000);  // tensor 1, past tensor 0's page
    f.put('\x7f');
  }
  State untouched = small(9);
  try {
    later.load(held[1].slot, untouched.live());
    ADD_FAILURE() << "a damaged slot loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("param/t1 fails its checksum"), std::string::npos)
        << e.what();
  }
  const State fresh = small(9);
  for (size_t i = 0; i < untouched.tensors.size(); ++i)
    EXPECT_TRUE(same_bits(untouched.tensors[i], fresh.tensors[i])) << "tensor " << i;
  // Another layout's tensors: refused.
  State other = small(9);
  other.tensors.pop_back();
  EXPECT_THROW(later.load(held[0].slot, other.live()), Error);

  // The next process's first snapshot keeps the newest one (step 3) and writes the other.
  later.reserve(live.live());
  later.take(manifest(4), live.live(), true);
  later.settle();
  const auto now = later.held();
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now[0].manifest.step, 4);
  EXPECT_EQ(now[1].manifest.step, 3);
  later.remove();
  EXPECT_TRUE(later.held().empty());
  EXPECT_FALSE(fs::exists(later.data_file(0)));
  EXPECT_FALSE(fs::exists(later.data_file(1)));
}

// The device copy's checksums, tensor by tensor on threads of their own: each equal to
// the serial xxh3 of its bytes, whatever the threads and the order of sizes.
TEST(Checksums, EachSpanOnThreadsEqualsItsSerialHash) {
  const State s = make_state(7);
  std::vector<std::pair<const void*, size_t>> spans;
  for (const std::vector<float>& t : s.tensors) spans.emplace_back(t.data(), t.size() * 4);
  spans.emplace_back(s.tensors[1].data() + 17, 0);  // an empty tensor
  for (int threads : {1, 3, 16}) {
    const std::vector<uint64_t> got = xxh3_each(spans, threads);
    ASSERT_EQ(got.size(), spans.size());
    for (size_t i = 0; i < spans.size(); ++i)
      EXPECT_EQ(got[i], XXH3_64bits(spans[i].first, spans[i].second)) << i << " " << threads;
  }
  EXPECT_TRUE(xxh3_each({}, 4).empty());
}

}  // namespace
}  // namespace pentad::ckpt
