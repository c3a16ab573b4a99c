// Checkpoints that cannot be written or read: a write that fails, a full disk (before the
// data, and inside HDF5's metadata), every kind of damage to the files and the manifest; each
// reported in one line with the file (and tensor) to blame, never as a crash or an HDF5 error
// dump.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/direct_io.h"
#include "checkpoint/h5.h"
#include "checkpoint_test_util.h"

namespace pentad::ckpt {
namespace {

namespace fs = std::filesystem;

using checkpoint_test_util::CheckpointTest;
using checkpoint_test_util::Global;

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

}  // namespace
}  // namespace pentad::ckpt
