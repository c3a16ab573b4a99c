#include "kernels/cpu/linear.h"

#include <algorithm>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC) {
  if (N == 0 || OC == 0) return;
  // Seed every row with the bias so a single gemm with beta = 1 adds the product on top.
  if (bias) {
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin)
    for (int64_t n = 0; n < N; ++n) std::copy(bias, bias + OC, out + n * OC);
  }
  gemm(false, true, N, OC, C, T(1), inp, C, weight, C, bias ? T(1) : T(0), out, OC);
}

template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, bool accumulate_dinp) {
  if (dinp && N > 0 && C > 0) {
    if (OC == 0 && !accumulate_dinp)
      std::fill(dinp, dinp + N * C, T(0));
    else
      gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, accumulate_dinp ? T(1) : T(0), dinp,
           C);
  }
  if (dweight && N > 0 && OC > 0 && C > 0) {
    gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  }
  if (dbias) {
    // Each thread owns a slice of columns and walks all rows in order: the sum order is
    // fixed whatever the thread count, and rows are read contiguously within the slice.
    constexpr int64_t kSlice = 64;
    const int64_t slices = (OC + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin)
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t c0 = s * kSlice, c1 = std::min(OC, c0 + kSlice);
      T acc[kSlice] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * OC;
#pragma omp simd
        for (int64_t o = c0; o < c1; ++o) acc[o - c0] += row[o];
      }
      for (int64_t o = c0; o < c1; ++o) dbias[o] += acc[o - c0];
    }
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t);
template void linear_forward<double>(double*, const double*, const double*, const double*, int64_t,
                                     int64_t, int64_t);
template void linear_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t, bool);
template void linear_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int64_t, int64_t, int64_t, bool);

}  // namespace pentad::kernels::cpu
