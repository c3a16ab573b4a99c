// Checkpoints: shards written by several fake ranks in one process read back bitwise in
// any other split; the manifest describes them; large shards, format version 1's checksums
// and `inspect` verify every shard, naming the file (and tensor) to blame.
#include "checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/h5.h"
#include "checkpoint_test_util.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

using checkpoint_test_util::bitwise_equal;
using checkpoint_test_util::CheckpointTest;
using checkpoint_test_util::Global;
using checkpoint_test_util::make_tensor;
using checkpoint_test_util::with_dim;

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
