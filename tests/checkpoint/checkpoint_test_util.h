#pragma once
// What the sources of checkpoint_tests' checks of the checkpoint files share
// (checkpoint_test.cpp: reads, the manifest, verification; checkpoint_commit_test.cpp:
// commit, listing, retention and recycling; checkpoint_damage_test.cpp: write failures, full
// disks, damage and malformed manifests): four global tensors and their reference slicing,
// and a fixture that writes them as three fake ranks in one process and commits them.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/h5.h"
#include "core/check.h"
#include "tests/fast_random.h"

namespace pentad::ckpt::checkpoint_test_util {

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

inline Global make_tensor(const std::string& name, Shape shape, uint32_t seed) {
  Global g{name, shape, std::vector<float>(static_cast<size_t>(shape.numel()))};
  fast_random_fill(g.data.data(), g.data.size(), seed);
  // Values whose bits a careless copy or conversion would change.
  g.data[0] = -0.0f;
  g.data[1] = std::numeric_limits<float>::denorm_min();
  if (g.data.size() > 2) g.data[2] = std::numeric_limits<float>::quiet_NaN();
  if (g.data.size() > 3) g.data[3] = -std::numeric_limits<float>::infinity();
  return g;
}

inline Shape with_dim(Shape s, int dim, int64_t extent) {
  s.dims[static_cast<size_t>(dim)] = extent;
  return s;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
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

}  // namespace pentad::ckpt::checkpoint_test_util
