#pragma once
// What the sources of cuda_kernels_test share (one test program, a source per group of op
// families: cuda_kernels_test.cpp and cuda_kernels_*_test.cpp): the fixtures, the
// upload/compare helpers and the bounds.
//
// Every CUDA kernel against the CPU reference: the same ops.h entry point called with CPU
// tensors (F32) and with CUDA tensors (F32 and BF16), over a sweep of shapes with odd sizes,
// fresh random inputs, and every overwritten output poisoned with NaN before the call
// (accumulated outputs start from random values instead). BF16 inputs are rounded to BF16
// on the host first, so both sides see the same values. Bounds: the largest error relative
// to the largest reference value, 1e-5 for F32 and 1e-2 for BF16; no NaN may survive.
//
// Without a CUDA device every test skips with "no CUDA device", and ctest reports it as
// skipped (tests/cuda/CMakeLists.txt); scripts/gpu_test.sh fails on a skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace pentad {

// How gtest (and so the ctest names) print the dtype parameter. Inline and seen by every
// source: gtest's printers are templates instantiated in each.
inline void PrintTo(DType dtype, std::ostream* os) {
  *os << dtype_name(dtype);
}

}  // namespace pentad

// The fixtures are one type in every source (gtest refuses a suite whose fixture types
// differ), so they and the helpers live in a named namespace, not an anonymous one.
namespace pentad::cuda_kernels {

using testing::randn;
using testing::random_ids;
using testing::rel_error;
using testing::to_float;
using testing::view;
namespace k = kernels;

// ---- host <-> device ----

inline float round_to(DType dtype, float x) {
  return dtype == DType::BF16 ? bf16_to_float(float_to_bf16(x)) : x;
}

inline std::vector<float> rounded(DType dtype, std::vector<float> v) {
  for (float& x : v) x = round_to(dtype, x);
  return v;
}

// n standard normal values (times stddev), representable in dtype.
inline std::vector<float> random(DType dtype, int64_t n, uint64_t seed, double stddev = 1.0) {
  return rounded(dtype, to_float(randn(static_cast<size_t>(n), seed, stddev)));
}

using testing::download;
using testing::Gpu;

inline double tolerance(DType dtype) {
  return dtype == DType::BF16 ? 1e-2 : 1e-5;
}

// got (from the GPU) against want (the CPU reference): no non-finite value where the
// reference is finite, and the largest error relative to the largest reference value.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, double tol, double floor = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]) && std::isfinite(want[i]) && bad++ == 0) first_bad = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " non-finite values, the first at " << first_bad
                     << " (an output left unwritten stays NaN)";
  EXPECT_LT(rel_error(got, want, floor), tol) << what;
}
inline void expect_close(const std::string& what, const Tensor& got, const std::vector<float>& want,
                         DType dtype, double floor = 1e-6) {
  expect_close(what, download(got), want, tolerance(dtype), floor);
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- fixtures ----

inline bool have_device() {
  return cuda_device_count() > 0;
}

// Instantiated for F32 and BF16 in cuda_kernels_test.cpp.
class CudaKernel : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
  DType dt() const { return GetParam(); }
  std::vector<float> rand(int64_t n, double stddev = 1.0) {
    return random(dt(), n, ++seed_ * 7919, stddev);
  }
  Gpu gpu;

 private:
  uint64_t seed_ = 0;
};

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
  Gpu gpu;
};

}  // namespace pentad::cuda_kernels
