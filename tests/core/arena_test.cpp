// Reserved arenas (core/tensor.h) and the parameter store's sparse mode built on them
// (core/params.h): what ZeRO's stages 2 and 3 keep in memory, on the CPU as on CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/params.h"

using namespace pentad;

namespace {

ParamStore two_matrices(Placement placement) {
  ParamStore p;
  p.add("a.weight", Shape{300, 256}, Init::Normal, 0.02f, true);  // page-aligned (>= 64K values)
  p.add("b.weight", Shape{64, 32}, Init::Normal, 0.02f, true);
  p.allocate(placement);
  return p;
}

}  // namespace

// commit() backs whole pages around what it is asked, with zeros, merges what is backed, and
// everything else stays without memory: touching it kills the process.
TEST(Arena, ReservedBacksOnlyWhatIsCommitted) {
  const size_t page = Arena::kPageBytes;
  Arena a = Arena::reserved("test", 10 * page + 100);
  EXPECT_TRUE(a.is_reserved());
  EXPECT_EQ(a.capacity(), 11 * page);
  EXPECT_EQ(a.committed_bytes(), 0u);
  a.commit(100, page + 1);  // pages 0 and 1
  EXPECT_EQ(a.committed_bytes(), 2 * page);
  auto* bytes = static_cast<unsigned char*>(a.base());
  EXPECT_TRUE(std::all_of(bytes, bytes + 2 * page, [](unsigned char c) { return c == 0; }));
  std::memset(bytes, 7, 2 * page);
  a.commit(page, 3 * page);  // page 2 joins; pages 0 and 1 keep their bytes
  EXPECT_EQ(a.committed_bytes(), 3 * page);
  EXPECT_EQ(bytes[page + 5], 7);
  EXPECT_EQ(bytes[2 * page + 5], 0);
  a.discard(0, a.capacity());  // only what is backed is touched
  EXPECT_EQ(bytes[5], 0);
  EXPECT_DEATH(bytes[5 * page] = 1, "") << "a write where nothing is committed must fault";
  Arena moved = std::move(a);
  EXPECT_EQ(moved.committed_bytes(), 3 * page);
  EXPECT_EQ(a.base(), nullptr);
}

// A sparse store: initialize() writes what is backed, bitwise what a whole store draws;
// a parameter without a home is refused by name; homes and gradient sources resolve.
TEST(Arena, SparseParamStoreReadsThroughHomes) {
  ParamStore whole = two_matrices({});
  whole.initialize(3);
  ParamStore p = two_matrices({Device::CPU, DType::F32, true, true});
  const ParamSpec& a = p.spec(0);
  const int64_t half = a.local_shape.numel() / 2;
  p.commit_params(int64_t(a.offset) + half, int64_t(a.offset) + a.local_shape.numel());
  p.initialize(3);
  EXPECT_TRUE(std::equal(whole.param(0).f32() + half, whole.param(0).f32() + a.local_shape.numel(),
                         p.all_params().f32() + a.offset + half));
  try {
    p.param(1);
    FAIL() << "an unplaced parameter of a sparse store must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("b.weight"), std::string::npos) << e.what();
  }
  std::vector<float> unit(size_t(p.numel() - int64_t(p.spec(1).offset)), 5.0f);
  p.place_params(int64_t(p.spec(1).offset), p.numel(), unit.data(), nullptr);
  EXPECT_TRUE(p.placed(1));
  EXPECT_EQ(p.param(1).f32(), unit.data());
  p.unplace_params(int64_t(p.spec(1).offset), p.numel());
  EXPECT_THROW(p.param(1), std::exception);
  int asked = 0;
  std::vector<float> grads(size_t(p.numel()), 0.0f);
  p.add_grad_source([&](int id) {
    ++asked;
    p.place_grads(0, p.numel(), grads.data());
    return id >= 0;
  });
  EXPECT_EQ(p.grad(1).f32(), grads.data() + p.spec(1).offset);
  EXPECT_EQ(p.grad(0).f32(), grads.data());
  EXPECT_EQ(asked, 1) << "placed once, then found";
  p.unplace_grads(0, p.numel());
  EXPECT_EQ(
      p.committed_param_bytes(),
      size_t(half) * sizeof(float) / Arena::kPageBytes * Arena::kPageBytes + Arena::kPageBytes)
      << "half of a page-aligned parameter: its pages, the first one widened";
}
