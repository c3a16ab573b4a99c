#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/linear.h"

namespace pentad::kernels::cpu {

template <typename T>
void moe_permute(T* out, const T* inp, const int32_t* src, int64_t A, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < A; ++a)
    std::memcpy(out + a * C, inp + int64_t(src[a]) * C, size_t(C) * sizeof(T));
}

template <typename T>
void moe_unpermute(T* out, const T* inp, const int32_t* pos, const T* w, int64_t N, int64_t k,
                   int64_t C, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    T* o = out + t * C;
    if (!accumulate) std::memset(o, 0, size_t(C) * sizeof(T));
    for (int64_t j = 0; j < k; ++j) {  // picks in order: the sum's order is fixed
      const int32_t p = pos[t * k + j];
      if (p < 0) continue;
      const T* x = inp + int64_t(p) * C;
      const T s = w ? w[t * k + j] : T(1);
      for (int64_t c = 0; c < C; ++c) o[c] += s * x[c];
    }
  }
}

template <typename T>
void moe_unpermute_backward(T* dinp, T* dw, const T* dout, const T* inp, const int32_t* pos,
                            const T* w, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const T* g = dout + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t p = pos[t * k + j];
      if (p < 0) {
        dw[t * k + j] = T(0);
        continue;
      }
      const T* x = inp + int64_t(p) * C;
      T* d = dinp + int64_t(p) * C;
      const T s = w[t * k + j];
      double dot = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        d[c] = s * g[c];
        dot += double(g[c]) * double(x[c]);
      }
      dw[t * k + j] = T(dot);
    }
  }
}

// Both grouped linears run one parallel region. A thread's share of the R rows (or of a
// weight's OC rows) is fixed by the shapes alone, and the GEMMs it calls from inside the
// region run on that thread only (OpenBLAS does not nest), so nothing waits on another
// thread until the region ends and the results are fixed for a fixed thread count. A
// GEMM never splits its inner (summed) dimension however its rows and columns are cut,
// so every element equals the one-GEMM-per-group result.
template <typename T>
void grouped_linear_forward(T* out, const T* inp, const int64_t* rows, const T* const* weight,
                            const T* const* bias, int64_t G, int64_t C, int64_t OC) {
  int64_t R = 0;
  for (int64_t g = 0; g < G; ++g) R += rows[g];
  if (R == 0 || OC == 0) return;
#pragma omp parallel
  {
    const Range mine = thread_range(R, omp_get_thread_num(), omp_get_num_threads());
    int64_t start = 0;
    for (int64_t g = 0; g < G; start += rows[g], ++g) {
      const int64_t b = std::max(start, mine.begin), e = std::min(start + rows[g], mine.end);
      if (b < e)
        linear_forward<T>(out + b * OC, inp + b * C, weight[g], bias ? bias[g] : nullptr, e - b, C,
                          OC);
    }
  }
}

template <typename T>
void grouped_linear_backward(T* dinp, T* const* dweight, T* const* dbias, const T* dout,
                             const T* inp, const int64_t* rows, const T* const* weight, int64_t G,
                             int64_t C, int64_t OC, bool accumulate_dinp) {
  int64_t R = 0;
  for (int64_t g = 0; g < G; ++g) R += rows[g];
  if (R == 0) return;
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), nthreads = omp_get_num_threads();
    // dweight[g] (OC, C) += dout_g^T (OC, n) @ inp_g (n, C): this thread's OC rows of it.
    // dbias[g] (OC) += column sums of dout_g: this thread's columns, rows in order.
    const Range oc = thread_range(OC, tid, nthreads);
    int64_t start = 0;
    for (int64_t g = 0; g < G; start += rows[g], ++g) {
      const int64_t n = rows[g];
      if (n == 0 || oc.begin == oc.end) continue;
      const T* dy = dout + start * OC;
      if (dweight && dweight[g] && C > 0)
        gemm(true, false, oc.end - oc.begin, C, n, T(1), dy + oc.begin, OC, inp + start * C, C,
             T(1), dweight[g] + oc.begin * C, C);
      if (dbias && dbias[g]) {  // slices of columns, rows read contiguously within one
        constexpr int64_t kSlice = 64;
        for (int64_t c0 = oc.begin; c0 < oc.end; c0 += kSlice) {
          const int64_t c1 = std::min(oc.end, c0 + kSlice);
          T acc[kSlice] = {};
          for (int64_t r = 0; r < n; ++r) {
            const T* row = dy + r * OC;
#pragma omp simd
            for (int64_t o = c0; o < c1; ++o) acc[o - c0] += row[o];
          }
          for (int64_t o = c0; o < c1; ++o) dbias[g][o] += acc[o - c0];
        }
      }
    }
    // dinp (n, C) = dout_g (n, OC) @ weight[g] (OC, C): this thread's rows of every group.
    if (dinp && C > 0) {
      const Range mine = thread_range(R, tid, nthreads);
      start = 0;
      for (int64_t g = 0; g < G; start += rows[g], ++g) {
        const int64_t b = std::max(start, mine.begin), e = std::min(start + rows[g], mine.end);
        if (b >= e) continue;
        if (OC == 0 && !accumulate_dinp)
          std::fill(dinp + b * C, dinp + e * C, T(0));
        else if (OC > 0)
          gemm(false, false, e - b, C, OC, T(1), dout + b * OC, OC, weight[g], C,
               accumulate_dinp ? T(1) : T(0), dinp + b * C, C);
      }
    }
  }
}

#define PENTAD_MOE_KERNELS(T)                                                                   \
  template void moe_permute<T>(T*, const T*, const int32_t*, int64_t, int64_t);                 \
  template void moe_unpermute<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t,      \
                                 int64_t, bool);                                                \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, \
                                          int64_t, int64_t, int64_t);                           \
  template void grouped_linear_forward<T>(T*, const T*, const int64_t*, const T* const*,        \
                                          const T* const*, int64_t, int64_t, int64_t);          \
  template void grouped_linear_backward<T>(T*, T* const*, T* const*, const T*, const T*,        \
                                           const int64_t*, const T* const*, int64_t, int64_t,   \
                                           int64_t, bool);
PENTAD_MOE_KERNELS(float)
PENTAD_MOE_KERNELS(double)
#undef PENTAD_MOE_KERNELS

}  // namespace pentad::kernels::cpu
