// Checkpoints: shards written by several fake ranks in one process read back bitwise in
// any other split; commit, listing and retention; every kind of damage is reported with the
// file (and tensor) to blame, never as a crash or an HDF5 error dump.
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/direct_io.h"
#include "checkpoint/h5.h"
#include "tests/fast_random.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

// A global tensor and its reference slicing (independent of checkpoint/box.h).
struct Global {
  std::string name;
  Shape shape;
  std::vector<float> data;

  // The slice [start, start + local[dim]) along dim, row-major.
  std::vector<float> slice(int dim, int64_t start, const Shape& local) const {
    std::vector<float> out;
    int64_t idx[4] = {0, 0, 0, 0};
    std::function<void(int, int64_t)> walk = [&](int d, int64_t offset) {
      if (d == shape.ndim) {
        out.push_back(data[static_cast<size_t>(offset)]);
        return;
      }
      const int64_t lo = d == dim ? start : 0;
      for (idx[d] = lo; idx[d] < lo + local[d]; ++idx[d]) walk(d + 1, offset * shape[d] + idx[d]);
    };
    walk(0, 0);
    return out;
  }
};

Global make_tensor(const std::string& name, Shape shape, uint32_t seed) {
  Global g{name, shape, std::vector<float>(static_cast<size_t>(shape.numel()))};
  fast_random_fill(g.data.data(), g.data.size(), seed);
  // Values whose bits a careless copy or conversion would change.
  g.data[0] = -0.0f;
  g.data[1] = std::numeric_limits<float>::denorm_min();
  if (g.data.size() > 2) g.data[2] = std::numeric_limits<float>::quiet_NaN();
  if (g.data.size() > 3) g.data[3] = -std::numeric_limits<float>::infinity();
  return g;
}

Shape with_dim(Shape s, int dim, int64_t extent) {
  s.dims[static_cast<size_t>(dim)] = extent;
  return s;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = (fs::temp_directory_path() / fmt::format("pentad-ckpt-{}-{}", ::getpid(), info->name()))
                .string();
    fs::remove_all(root_);
    a_ = make_tensor("param/a", Shape{8, 6}, 1);            // split along dim 0 over ranks 0-1
    b_ = make_tensor("adam_m/blocks.0.b", Shape{4, 9}, 2);  // split along dim 1 over ranks 0-2
    c_ = make_tensor("param/c", Shape{5}, 3);               // replicated: rank 0 writes it
    d_ = make_tensor("param/d", Shape{2, 3, 4, 5}, 4);      // 4 dims, split along dim 2
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  ShardData shard(const Global& g, int dim, int64_t start, int64_t extent,
                  std::vector<std::vector<float>>& keep) {
    const Shape local = dim < 0 ? g.shape : with_dim(g.shape, dim, extent);
    keep.push_back(g.slice(dim, start, local));
    return ShardData{ShardInfo{g.name, g.shape, dim, start, local, 0}, keep.back().data()};
  }

  // Writes the four tensors as three ranks into partial_dir(step); returns nothing committed.
  void write_ranks(int64_t step) {
    std::vector<std::vector<float>> keep;
    keep.reserve(16);
    std::vector<std::vector<ShardData>> ranks(3);
    ranks[0] = {shard(a_, 0, 0, 4, keep), shard(b_, 1, 0, 3, keep), shard(c_, -1, 0, 5, keep),
                shard(d_, 2, 0, 1, keep)};
    ranks[1] = {shard(a_, 0, 4, 4, keep), shard(b_, 1, 3, 3, keep), shard(d_, 2, 1, 3, keep)};
    ranks[2] = {shard(b_, 1, 6, 3, keep)};
    for (int r = 0; r < 3; ++r)
      write_rank_file(partial_dir(root_, step) + "/" + rank_file_name(r),
                      ranks[static_cast<size_t>(r)]);
  }

  std::string save(int64_t step, int keep_last = 0) {
    write_ranks(step);
    Manifest m;
    m.step = step;
    m.optimizer_steps = step + 1;
    m.layout = Layout{6, 3, 2, 1, 1, true};
    m.recipe_toml = "[model]\nd_model = 6\n[train]\nsteps = 10\n";
    remove_dirs(commit(root_, m, keep_last));
    return checkpoint_dir(root_, step);
  }

  const Global& global_of(const std::string& name) const {
    return name == a_.name ? a_ : name == b_.name ? b_ : name == c_.name ? c_ : d_;
  }

  // Rewrites a committed checkpoint's manifest as format version 1 wrote it: no algorithm
  // named, zlib's crc32 of each shard as an integer.
  void make_version_1(const std::string& dir) {
    auto j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
    j["version"] = 1;
    j.erase("checksum");
    for (auto& shard : j["shards"]) {
      Shape shape;
      for (const auto& d : shard["local_shape"]) shape.dims[static_cast<size_t>(shape.ndim++)] = d;
      std::vector<float> data(static_cast<size_t>(shape.numel()));
      h5::File(dir + "/" + shard["file"].get<std::string>())
          .read(shard["name"], shape, data.data());
      shard.erase("checksum");
      shard["crc32"] = crc32_z(0L, reinterpret_cast<const Bytef*>(data.data()), data.size() * 4);
    }
    std::ofstream(dir + "/manifest.json") << j.dump(1);
  }

  std::string file(int64_t step, int rank) {
    return checkpoint_dir(root_, step) + "/" + rank_file_name(rank);
  }

  // The message of the pentad::Error that f throws ("" if none), with stderr checked to
  // stay silent (no HDF5 error dump).
  template <typename F>
  std::string error_of(F f) {
    ::testing::internal::CaptureStderr();
    std::string message;
    try {
      f();
    } catch (const Error& e) {
      message = e.what();
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "") << "stderr was not silent";
    EXPECT_NE(message, "") << "no pentad::Error thrown";
    return message;
  }

  std::string root_;
  Global a_, b_, c_, d_;
};

// Every request is read with a fresh reader (first touch: whole shards, checksummed) and
// again with one shared reader (shards already verified: hyperslab reads).
TEST_F(CheckpointTest, ReadsAnySplitBitwise) {
  const std::string dir = save(100);
  struct Request {
    const Global* g;
    int dim;
    int64_t start, extent;
  };
  const std::vector<Request> requests = {
      {&a_, -1, 0, 0},  // whole tensors
      {&b_, -1, 0, 0}, {&c_, -1, 0, 0},
      {&d_, -1, 0, 0}, {&a_, 1, 2, 3},  // stored along dim 0, wanted along dim 1
      {&a_, 0, 3, 4},                   // uneven, straddling the two stored shards
      {&a_, 0, 4, 4},                   // exactly one stored shard
      {&b_, 0, 1, 2},                   // stored along dim 1, wanted along dim 0
      {&b_, 1, 2, 5},                   // along the stored dim, spanning three shards unevenly
      {&b_, 1, 3, 3},                   // exactly rank 1's shard
      {&c_, 0, 1, 3},                   // a slice of a replicated vector
      {&d_, 1, 1, 2},                   // 4-D: stored along dim 2, wanted along dim 1
      {&d_, 2, 1, 2},                   // 4-D: uneven along the stored dim
      {&d_, 3, 0, 2},                   // 4-D: along the innermost dim
  };
  Reader shared(dir);
  for (int pass = 0; pass < 2; ++pass)
    for (const Request& q : requests) {
      const Global& g = *q.g;
      const Shape local = q.dim < 0 ? g.shape : with_dim(g.shape, q.dim, q.extent);
      const std::vector<float> expected = g.slice(q.dim, q.start, local);
      std::vector<float> got(expected.size(), 7.0f);
      if (pass == 0) {
        Reader fresh(dir);
        fresh.read(g.name, g.shape, q.dim, q.start, local, got.data());
      } else {
        shared.read(g.name, g.shape, q.dim, q.start, local, got.data());
      }
      EXPECT_TRUE(bitwise_equal(got, expected)) << g.name << " dim " << q.dim << " [" << q.start
                                                << ", +" << q.extent << ") pass " << pass;
    }
}

TEST_F(CheckpointTest, ManifestDescribesTheCheckpoint) {
  const std::string dir = save(42);
  Reader r(dir);
  const Manifest& m = r.manifest();
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.optimizer_steps, 43);
  EXPECT_EQ(m.layout.world, 6);
  EXPECT_EQ(m.layout.tp, 3);
  EXPECT_EQ(m.layout.dp, 2);
  EXPECT_TRUE(m.layout.sequence_parallel);
  EXPECT_EQ(m.recipe_toml, "[model]\nd_model = 6\n[train]\nsteps = 10\n");
  EXPECT_EQ(m.shards.size(), 8u);
  EXPECT_EQ(r.tensor_names(),
            (std::vector<std::string>{"adam_m/blocks.0.b", "param/a", "param/c", "param/d"}));
  EXPECT_TRUE(r.has("param/a"));
  EXPECT_FALSE(r.has("param/A"));
  EXPECT_EQ(r.global_shape("param/d"), (Shape{2, 3, 4, 5}));
  // Checksums are xxh3-64 (XXH3_64bits, seed 0) of the shard's bytes.
  EXPECT_EQ(m.checksum, "xxh3-64");
  for (const Manifest::Entry& e : m.shards) {
    const std::vector<float> s =
        global_of(e.shard.name).slice(e.shard.shard_dim, e.shard.shard_start, e.shard.local_shape);
    EXPECT_EQ(e.shard.checksum, XXH3_64bits(s.data(), s.size() * sizeof(float)))
        << e.file << " " << e.shard.name;
  }
  // The on-disk JSON carries the documented fields.
  std::ifstream in(dir + "/manifest.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("version"), 2);
  EXPECT_EQ(j.at("checksum"), "xxh3-64");
  EXPECT_EQ(j.at("step"), 42);
  EXPECT_EQ(j.at("layout").at("pp"), 1);
  EXPECT_EQ(j.at("files").size(), 3u);
  EXPECT_EQ(j.at("shards").at(0).at("global_shape"), nlohmann::json::array({8, 6}));
  EXPECT_EQ(j.at("shards").at(0).at("checksum"),
            fmt::format("{:016x}", m.shards.at(0).shard.checksum));
  EXPECT_FALSE(fs::exists(partial_dir(root_, 42)));
}

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

TEST_F(CheckpointTest, WriteFailureNamesTheFile) {
  fs::create_directories(root_);
  std::ofstream(root_ + "/blocker") << "x";
  const std::string path = root_ + "/blocker/rank-00000.h5";
  const std::string message = error_of([&] { write_rank_file(path, {}); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  // HDF5 itself fails: the temporary name is taken by a directory.
  const std::string path2 = root_ + "/rank-00001.h5";
  fs::create_directories(path2 + ".tmp");
  const std::string message2 = error_of([&] { write_rank_file(path2, {}); });
  EXPECT_NE(message2.find(path2 + ": cannot create the file"), std::string::npos) << message2;
}

// A small file system of its own (a tmpfs; needs root), unmounted when it goes.
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ =
        std::system(
            fmt::format("mount -t tmpfs -o size={} tmpfs {} 2>/dev/null", size, dir).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) [[maybe_unused]]
      const int rc = std::system(fmt::format("umount {}", dir_).c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// A full disk: one line naming the file, the system's words and the bytes needed, before
// anything is written; no HDF5 text.
TEST_F(CheckpointTest, FullDiskIsOneLineWithTheBytesNeeded) {
  SmallDisk disk(root_ + "/small", "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  std::vector<float> data(100'000, 1.0f);
  const std::string path = root_ + "/small/step-00000001.partial/" + rank_file_name(0);
  const std::string message = error_of([&] {
    write_rank_file(path, {ShardData{ShardInfo{"param/a", Shape{100'000}, -1, 0, Shape{100'000}, 0},
                                     data.data()}});
  });
  EXPECT_NE(message.find(path + ": No space left on device: needs "), std::string::npos) << message;
  EXPECT_NE(message.find(" bytes free"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  // The disk filled after the check: the data's own write says it in one line too.
  const std::string file = root_ + "/small/data.bin";
  std::ofstream(file).put('x');
  const std::string late = error_of([&] {
    write_extents(file, file, {Extent{0, data.data(), data.size() * sizeof(float)}}, true);
  });
  EXPECT_NE(late.find(file + ": cannot write the data: No space left on device (400000 bytes"),
            std::string::npos)
      << late;
}

// Where HDF5's own metadata does not fit (the disk filled after the check): the system's
// words in one line, and the file HDF5 could not close does not hang or crash the process
// at exit (ctest runs this test alone and sees its exit).
TEST_F(CheckpointTest, FullDiskInsideHdf5IsOneLine) {
  SmallDisk disk(root_ + "/small", "16k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  std::vector<float> data(100, 1.0f);
  std::vector<ShardData> shards;
  for (int i = 0; i < 300; ++i)
    shards.push_back({ShardInfo{fmt::format("param/t{}", i), Shape{100}, -1, 0, Shape{100}, 0},
                      data.data(), true});
  const std::string path = root_ + "/small/rank-00000.h5";
  const std::string message = error_of([&] { h5::create_file(path + ".tmp", path, shards); });
  EXPECT_NE(message.find(path + ": cannot write HDF5's metadata: No space left on device"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// Damage and the error it must produce: substrings of the message.
TEST_F(CheckpointTest, ReportsDamageNamingTheCulprit) {
  struct Case {
    const char* what;
    std::function<void(const std::string& dir)> damage;
    std::function<void(Reader&)> use;  // after opening the reader
    std::vector<std::string> expect;
  };
  std::vector<float> buffer(1024);
  auto read_whole = [&](const Global& g) {
    return [&](Reader& r) { r.read(g.name, g.shape, -1, 0, g.shape, buffer.data()); };
  };
  const std::vector<Case> cases = {
      {"flipped byte",
       [&](const std::string& dir) {
         const std::string f = dir + "/" + rank_file_name(1);
         const int64_t offset = h5::data_offset(f, a_.name) + 5 * 4 + 1;  // inside row 4's data
         std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
         io.seekg(offset);
         char byte = 0;
         io.read(&byte, 1);
         byte = static_cast<char>(byte ^ 0x10);
         io.seekp(offset);
         io.write(&byte, 1);
       },
       read_whole(a_),
       {"rank-00001.h5", "param/a", "checksum mismatch", "corrupt"}},
      {"truncated file",
       [&](const std::string& dir) {
         fs::resize_file(dir + "/" + rank_file_name(0),
                         fs::file_size(dir + "/" + rank_file_name(0)) / 2);
       },
       read_whole(c_),
       {"rank-00000.h5"}},
      {"deleted file",
       [&](const std::string& dir) { fs::remove(dir + "/" + rank_file_name(2)); },
       read_whole(b_),
       {"rank-00002.h5", "missing"}},
      {"tensor missing from the file",
       [&](const std::string& dir) {
         auto j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
         for (auto& s : j["shards"])
           if (s["name"] == "param/c") s["name"] = "param/zz";
         std::ofstream(dir + "/manifest.json") << j.dump();
       },
       [&](Reader& r) { r.read("param/zz", Shape{5}, -1, 0, Shape{5}, buffer.data()); },
       {"rank-00000.h5", "param/zz", "not in the file"}},
      {"shard missing from the manifest",
       [&](const std::string& dir) {
         auto j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
         auto& shards = j["shards"];
         for (size_t i = 0; i < shards.size(); ++i)
           if (shards[i]["name"] == "param/a" && shards[i]["shard_start"] == 4) shards.erase(i);
         std::ofstream(dir + "/manifest.json") << j.dump();
       },
       read_whole(a_),
       {"does not cover param/a rows [4, 8) along dim 0"}},
      {"tensor not stored",
       [](const std::string&) {},
       [&](Reader& r) { r.read("param/nope", Shape{5}, -1, 0, Shape{5}, buffer.data()); },
       {"param/nope", "step-00000001"}},
      {"global shape differs",
       [](const std::string&) {},
       [&](Reader& r) {
         r.read(a_.name, Shape{8, 7}, -1, 0, Shape{8, 7}, buffer.data());
       },
       {"param/a", "(8, 6)", "(8, 7)"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(root_);
    const std::string dir = save(1);
    c.damage(dir);
    const std::string message = error_of([&] {
      Reader r(dir);
      c.use(r);
    });
    for (const std::string& s : c.expect)
      EXPECT_NE(message.find(s), std::string::npos) << "'" << s << "' not in: " << message;
  }
}

TEST_F(CheckpointTest, MalformedManifestIsNamed) {
  const std::vector<std::string> manifests = {
      "{ not json",
      R"({"step": 1})",
      R"({"step": 1, "optimizer_steps": 1, "layout": {"world": 1, "tp": 1, "dp": 1, "pp": 1,
          "cp": 1, "sequence_parallel": false}, "recipe": "", "files": [],
          "shards": [{"file": "../x.h5", "name": "param/a", "global_shape": [2],
                      "shard_dim": -1, "shard_start": 0, "local_shape": [2], "crc32": 0}]})",
      R"({"step": 1, "optimizer_steps": 1, "layout": {"world": 1, "tp": 1, "dp": 1, "pp": 1,
          "cp": 1, "sequence_parallel": false}, "recipe": "", "files": [],
          "shards": [{"file": "rank-00000.h5", "name": "param/a", "global_shape": [2, 3],
                      "shard_dim": 1, "shard_start": 2, "local_shape": [2, 2], "crc32": 0}]})",
  };
  for (const std::string& text : manifests) {
    fs::remove_all(root_);
    const std::string dir = save(2);
    std::ofstream(dir + "/manifest.json") << text;
    const std::string message = error_of([&] { Reader r(dir); });
    EXPECT_NE(message.find(dir + "/manifest.json"), std::string::npos) << message;
  }
  fs::remove(checkpoint_dir(root_, 2) + "/manifest.json");
  const std::string message = error_of([&] { Reader r(checkpoint_dir(root_, 2)); });
  EXPECT_NE(message.find("manifest.json"), std::string::npos) << message;
}

// A large shard of odd size: the writer's checksum is XXH3_64bits of all its bytes, and a
// slice of it reads back bitwise.
TEST_F(CheckpointTest, LargeShardsVerify) {
  const Global big = make_tensor("param/big", Shape{3, 3'000'001}, 5);  // 36 MB, odd size
  write_rank_file(
      partial_dir(root_, 1) + "/" + rank_file_name(0),
      {ShardData{ShardInfo{big.name, big.shape, -1, 0, big.shape, 0}, big.data.data()}});
  Manifest m;
  m.step = 1;
  remove_dirs(commit(root_, m, 0));
  Reader r(checkpoint_dir(root_, 1));
  const Shape row = Shape{1, 3'000'001};
  std::vector<float> got(static_cast<size_t>(row.numel()));
  r.read(big.name, big.shape, 0, 2, row, got.data());
  EXPECT_TRUE(bitwise_equal(got, big.slice(0, 2, row)));
  EXPECT_EQ(r.manifest().shards.at(0).shard.checksum,
            XXH3_64bits(big.data.data(), big.data.size() * 4));
}

// Checkpoints of format version 1 (zlib crc32 checksums) still load and verify; shards
// above 8 MiB are checksummed in parallel pieces there, which must combine to the serial
// value. Damage is still caught, and what this pentad cannot check is refused by name.
TEST_F(CheckpointTest, ReadsVersion1AndRefusesUnknownChecksums) {
  const Global big = make_tensor("param/big", Shape{3, 3'000'001}, 5);
  write_ranks(1);
  write_rank_file(
      partial_dir(root_, 1) + "/" + rank_file_name(3),
      {ShardData{ShardInfo{big.name, big.shape, -1, 0, big.shape, 0}, big.data.data()}});
  Manifest m;
  m.step = 1;
  remove_dirs(commit(root_, m, 0));
  const std::string dir = checkpoint_dir(root_, 1);
  make_version_1(dir);
  {
    Reader r(dir);
    EXPECT_EQ(r.manifest().checksum, "crc32");
    std::vector<float> got(big.data.size());
    r.read(big.name, big.shape, -1, 0, big.shape, got.data());
    EXPECT_TRUE(bitwise_equal(got, big.data));
    EXPECT_EQ(r.verify_all(), 9);
  }
  EXPECT_NE(inspect(dir, true).find("crc32 checksums"), std::string::npos);

  const std::string f = dir + "/" + rank_file_name(3);
  const int64_t offset = h5::data_offset(f, big.name) + 4'000'001 * 4;
  {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(offset);
    io.write("\x01", 1);
  }
  std::string message = error_of([&] { Reader(dir).verify_all(); });
  for (const char* s : {"rank-00003.h5", "param/big", "crc32 checksum mismatch"})
    EXPECT_NE(message.find(s), std::string::npos) << message;

  auto j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  j["version"] = 2;
  j["checksum"] = "sha1";
  std::ofstream(dir + "/manifest.json") << j.dump();
  message = error_of([&] { Reader r(dir); });
  for (const char* s : {"manifest.json", "checksum algorithm 'sha1'"})
    EXPECT_NE(message.find(s), std::string::npos) << message;
  j["version"] = 3;
  std::ofstream(dir + "/manifest.json") << j.dump();
  message = error_of([&] { Reader r(dir); });
  EXPECT_NE(message.find("format version 3"), std::string::npos) << message;
}

TEST_F(CheckpointTest, InspectListsAndVerifies) {
  const std::string dir = save(12);
  const std::string text = inspect(dir, true);
  for (const char* s : {"step 12", "tp 3", "param/a", "adam_m/blocks.0.b", "param/c", "param/d",
                        "(2, 3, 4, 5)", "rank-00002.h5", "all 8 shards verified"})
    EXPECT_NE(text.find(s), std::string::npos) << "'" << s << "' not in:\n" << text;
  EXPECT_EQ(inspect(dir, false).find("verified"), std::string::npos);
  // The recorded recipe itself, as TOML, not a count of its lines.
  const std::string recipe = "  recipe (TOML):\n    [model]\n    d_model = 6\n    [train]\n";
  EXPECT_NE(text.find(recipe + "    steps = 10\n"), std::string::npos) << text;

  // Verification reads every shard, including ones no read would pick.
  const std::string f = dir + "/" + rank_file_name(2);
  const int64_t offset = h5::data_offset(f, b_.name);
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(offset);
  io.write("\x7f\x7f", 2);
  io.close();
  const std::string message = error_of([&] { inspect(dir, true); });
  EXPECT_NE(message.find("rank-00002.h5"), std::string::npos) << message;
  EXPECT_NE(message.find("adam_m/blocks.0.b"), std::string::npos) << message;
}

}  // namespace
}  // namespace pentad::ckpt
