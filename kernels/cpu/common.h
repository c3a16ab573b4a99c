#pragma once
// Shared helpers of the CPU kernels: BLAS by element type, static row partitions.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace pentad::kernels::cpu {

// Below this many elements a parallel region costs more (thread wake-up) than it saves;
// the choice depends only on the shape, so results stay fixed for a fixed thread count.
constexpr int64_t kParallelMin = 1 << 14;

// Row-major C (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// The contiguous share [begin, end) of n items that thread `tid` of `nthreads` owns. Fixed
// for a fixed thread count, which is what makes per-thread partial sums deterministic.
struct Range {
  int64_t begin, end;
};
inline Range thread_range(int64_t n, int tid, int nthreads) {
  return {n * tid / nthreads, n * (tid + 1) / nthreads};
}

// exp that vectorises inside `omp simd` loops (glibc's expf only does so under
// -ffast-math). Cephes' expf: x = n ln2 + r, |r| <= ln2/2, degree-7 polynomial for e^r,
// exponent bits for 2^n; within 2 ulp of expf. Inputs are clamped to [-87.3, 88.3], so
// it never returns 0, inf or a denormal: callers zero masked entries themselves.
inline float exp_vec(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);  // std::clamp's reference blocks simd
  // n = round(x / ln2) by the 1.5 * 2^23 trick: std::floor would block vectorisation.
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}
// Double precision is the test path: exactness over speed.
inline double exp_vec(double x) {
  return std::exp(x);
}

// tanh(x) = 1 - 2 / (e^2x + 1): absolute error ~1e-7, saturates to exactly +-1.
inline float tanh_vec(float x) {
  return 1.0f - 2.0f / (exp_vec(2.0f * x) + 1.0f);
}
inline double tanh_vec(double x) {
  return std::tanh(x);
}

}  // namespace pentad::kernels::cpu
