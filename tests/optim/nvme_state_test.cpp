// The NVMe offload engine against memory: what goes in comes out, at sizes that do not
// divide into sub-groups or blocks; update() gives bitwise what its function gives in
// memory, at every block size and queue depth; bad directories and full disks say which
// path and how many bytes.
#include "optim/nvme_state.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/check.h"
#include "tests/fast_random.h"

namespace pentad {
namespace {

namespace fs = std::filesystem;

class NvmeStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/pentad-nvme-test-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }

  NvmeOptions options(size_t block_bytes = 1 << 20, int queue_depth = 8,
                      int64_t subgroup_elements = 1 << 22) const {
    NvmeOptions o;
    o.dir = dir_;
    o.block_bytes = block_bytes;
    o.queue_depth = queue_depth;
    o.subgroup_elements = subgroup_elements;
    return o;
  }

  std::string dir_;
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  return fast_random(n, seed);
}

// Index of the first element whose bits differ, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no pentad::Error thrown)";
}

struct Shape {
  int64_t elements, subgroup_elements;
  int tensors;
};

TEST_F(NvmeStateTest, WriteReadRoundTripAtOddSizes) {
  // One element; fewer elements than a sub-group; several sub-groups with a short last one
  // (elements, sub-group and block all mutually odd); one tensor and three.
  for (Shape s : {Shape{1, 1 << 22, 2}, Shape{1000, 1 << 22, 1}, Shape{10007, 1000, 2},
                  Shape{300001, 65537, 3}}) {
    SCOPED_TRACE(fmt::format("elements {} sub-group {} tensors {}", s.elements, s.subgroup_elements,
                             s.tensors));
    NvmeState state(options(8192, 3, s.subgroup_elements), "roundtrip.state", s.elements,
                    s.tensors);
    EXPECT_TRUE(fs::exists(state.path()));
    EXPECT_EQ(fs::file_size(state.path()), state.file_bytes());
    EXPECT_EQ(state.file_bytes() % 4096, 0u);
    const size_t n = static_cast<size_t>(s.elements);
    std::vector<float> zeros(n, 0.0f), got(n, 1.0f);
    state.read(s.tensors - 1, 0, s.elements, got.data());
    EXPECT_EQ(first_difference(got, zeros), -1) << "a new file reads as zeros";

    std::vector<std::vector<float>> want;
    for (int t = 0; t < s.tensors; ++t) {
      want.push_back(random_floats(n, 17 + t));
      state.write(t, 0, s.elements, want[t].data());
    }
    // Overwrite a range that starts and ends inside sub-groups: the rest must stay.
    const int64_t lo = s.elements / 3, hi = s.elements - s.elements / 5;
    const std::vector<float> patch = random_floats(static_cast<size_t>(hi - lo), 99);
    state.write(0, lo, hi, patch.data());
    std::copy(patch.begin(), patch.end(), want[0].begin() + lo);
    for (int t = 0; t < s.tensors; ++t) {
      state.read(t, 0, s.elements, got.data());
      EXPECT_EQ(first_difference(got, want[t]), -1) << "tensor " << t;
    }
    // A range read across sub-group boundaries.
    std::vector<float> part(static_cast<size_t>(hi - lo));
    state.read(s.tensors - 1, lo, hi, part.data());
    EXPECT_EQ(first_difference(part, std::vector<float>(want[s.tensors - 1].begin() + lo,
                                                        want[s.tensors - 1].begin() + hi)),
              -1);
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "the destructor deletes the file";
}

TEST_F(NvmeStateTest, BackgroundReadsLandAtAnyAlignment) {
  // ZeRO-3's shares: ranges starting and ending inside pages and sub-groups, read into memory
  // at odd element offsets, several in flight at once and finished out of order.
  const int64_t n = 300007;
  NvmeState state(options(8192, 2, 65537), "background.state", n, 3);
  std::vector<std::vector<float>> want;
  for (int t = 0; t < 3; ++t) {
    want.push_back(random_floats(size_t(n), 40 + t));
    state.write(t, 0, n, want[t].data());
  }
  struct Range {
    int tensor;
    int64_t begin, end;
  };
  const std::vector<Range> ranges = {{2, 0, 1},          {2, 1, 2}, {2, 1023, 1025},
                                     {1, 65530, 131080}, {2, 7, n}, {0, n - 3, n}};
  std::vector<std::vector<float>> got;
  std::vector<uint64_t> reads;
  for (const Range& r : ranges) {
    got.emplace_back(size_t(r.end - r.begin) + 3, -1.0f);
    reads.push_back(state.start_read(r.tensor, r.begin, r.end));
  }
  EXPECT_THROW(state.update([](int64_t, int64_t, float* const*) {}), std::logic_error)
      << "no update while reads are in flight";
  for (size_t i = ranges.size(); i-- > 0;) {
    const Range& r = ranges[i];
    SCOPED_TRACE(fmt::format("tensor {} [{}, {})", r.tensor, r.begin, r.end));
    state.finish_read(reads[i], got[i].data() + 3);  // 12 bytes past an aligned start
    EXPECT_EQ(first_difference(std::vector<float>(got[i].begin() + 3, got[i].end()),
                               std::vector<float>(want[size_t(r.tensor)].begin() + r.begin,
                                                  want[size_t(r.tensor)].begin() + r.end)),
              -1);
    EXPECT_EQ(got[i][2], -1.0f) << "nothing written before out";
  }
  EXPECT_GT(state.stats().background_bytes, 0.0);
  state.update([](int64_t, int64_t, float* const*) {});  // allowed again
}

// One AdamW-like step on (m, v, weights): elementwise, so the sub-groups cannot change the result.
void adamw_step(const std::vector<float>& grad, int64_t begin, int64_t end, float* const* state) {
  float* m = state[0];
  float* v = state[1];
  for (int64_t i = 0; i < end - begin; ++i) {
    const float g = grad[static_cast<size_t>(begin + i)];
    m[i] = 0.9f * m[i] + 0.1f * g;
    v[i] = 0.999f * v[i] + 0.001f * g * g;
    state[2][i] -= 1e-3f * m[i] / (std::sqrt(v[i]) + 1e-8f);  // the third tensor: master weights
  }
}

struct Queueing {
  size_t block_bytes;
  int queue_depth;
};

TEST_F(NvmeStateTest, UpdateEqualsTheSameFunctionInMemoryBitwise) {
  const int64_t n = 300007;  // 5 sub-groups of 65536, the last short
  for (Queueing q : {Queueing{4096, 1}, Queueing{64 << 10, 4}, Queueing{1 << 20, 8}}) {
    SCOPED_TRACE(fmt::format("block {} depth {}", q.block_bytes, q.queue_depth));
    NvmeState state(options(q.block_bytes, q.queue_depth, 65536), "update.state", n, 3);
    std::vector<std::vector<float>> memory(3, std::vector<float>(n, 0.0f));
    memory[2] = random_floats(n, 5);
    state.write(2, 0, n, memory[2].data());
    const NvmeState::Stats before = state.stats();
    const int passes = 3;
    for (int pass = 0; pass < passes; ++pass) {
      const std::vector<float> grad = random_floats(n, 100 + pass);
      std::vector<int64_t> ranges;
      state.update([&](int64_t begin, int64_t end, float* const* s) {
        ranges.push_back(begin);
        ranges.push_back(end);
        adamw_step(grad, begin, end, s);
      });
      float* whole[3] = {memory[0].data(), memory[1].data(), memory[2].data()};
      adamw_step(grad, 0, n, whole);
      ASSERT_EQ(ranges.size(), 10u);
      for (size_t i = 0; i < ranges.size(); i += 2)  // in order, covering [0, n) once
        EXPECT_EQ(ranges[i], i == 0 ? 0 : ranges[i - 1]);
      EXPECT_EQ(ranges.back(), n);
    }
    std::vector<float> got(n);
    for (int t = 0; t < 3; ++t) {
      state.read(t, 0, n, got.data());
      EXPECT_EQ(first_difference(got, memory[t]), -1) << "tensor " << t;
    }
    const NvmeState::Stats after = state.stats();
    // Each pass reads and writes the file once; the check above read it once more.
    EXPECT_EQ(after.bytes_read - before.bytes_read, (passes + 1) * double(state.file_bytes()));
    EXPECT_EQ(after.bytes_written - before.bytes_written, passes * double(state.file_bytes()));
    EXPECT_GE(after.read_wait_s, 0.0);
  }
}

TEST_F(NvmeStateTest, AnExceptionInTheUpdateLeavesTheFileUsable) {
  const int64_t n = 50000;
  NvmeState state(options(4096, 2, 8192), "throw.state", n, 2);
  const std::vector<float> x = random_floats(n, 3);
  state.write(1, 0, n, x.data());
  EXPECT_THROW(state.update([](int64_t begin, int64_t, float* const*) {
    if (begin > 8192) throw std::runtime_error("fn failed");
  }),
               std::runtime_error);
  std::vector<float> got(n);
  state.read(1, 0, n, got.data());
  EXPECT_EQ(first_difference(got, x), -1);
}

TEST_F(NvmeStateTest, MissingDirectoryIsNamed) {
  const std::string missing = dir_ + "/no-such-dir";
  NvmeOptions o = options();
  o.dir = missing;
  const std::string msg = message_of([&] { NvmeState s(o, "x.state", 1000, 2); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST_F(NvmeStateTest, UnusableDirectoryIsNamedWithTheSystemsReason) {
  NvmeOptions o = options();
  o.dir = "/dev/null/x";  // under a file: as root, chmod cannot make a directory unwritable
  std::string msg = message_of([&] { NvmeState s(o, "x.state", 1000, 2); });
  EXPECT_NE(msg.find("/dev/null/x"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOTDIR)), std::string::npos) << msg;

  o.dir = "/proc/self";  // a directory, but no file can be created in it
  msg = message_of([&] { NvmeState s(o, "x.state", 1000, 2); });
  EXPECT_NE(msg.find("/proc/self/x.state"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
}

TEST_F(NvmeStateTest, BadOptionsAreRefused) {
  const std::string msg = message_of([&] { NvmeState s(options(1000), "x.state", 10, 1); });
  EXPECT_NE(msg.find("block_bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1000"), std::string::npos) << msg;
}

TEST_F(NvmeStateTest, FullFileSystemSaysHowManyBytes) {
  const std::string small = dir_ + "/small";
  fs::create_directory(small);
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=2m") != 0)
    GTEST_SKIP() << "cannot mount a 2 MiB tmpfs here (not root?): " << std::strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{small};
  NvmeOptions o = options();
  o.dir = small;
  const int64_t elements = 1 << 20;  // x 2 tensors x 4 bytes = 8 MiB
  const std::string msg = message_of([&] { NvmeState s(o, "full.state", elements, 2); });
  EXPECT_NE(msg.find("No space left"), std::string::npos) << msg;
  EXPECT_NE(msg.find(small + "/full.state"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8388608 bytes"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(small + "/full.state")) << "nothing left behind";
}

}  // namespace
}  // namespace pentad
