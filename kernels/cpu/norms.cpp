#include "kernels/cpu/norms.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const T m = sum / T(C);
    T var = 0;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const T s = T(1) / std::sqrt(var / T(C) + eps);
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c];
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = s;
  }
}

// Parameter gradients are sums over rows. Each thread sums its static block of rows into
// its own partial (n_threads, C) slab; the slabs are then added in thread order, so the
// result is bitwise fixed for a fixed thread count without atomics.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
  const int max_threads = omp_get_max_threads();
  std::vector<T> partial_dw(dweight ? static_cast<size_t>(max_threads * C) : 0, T(0));
  std::vector<T> partial_db(dbias ? static_cast<size_t>(max_threads * C) : 0, T(0));
#pragma omp parallel if (N * C >= kParallelMin)
  {
    const int tid = omp_get_thread_num(), nthreads = omp_get_num_threads();
    const Range rows = thread_range(N, tid, nthreads);
    T* pdw = dweight ? partial_dw.data() + tid * C : nullptr;
    T* pdb = dbias ? partial_db.data() + tid * C : nullptr;
    for (int64_t n = rows.begin; n < rows.end; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const T m = mean[n], s = rstd[n];
      if (pdw) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) pdw[c] += dy[c] * (x[c] - m) * s;
      }
      if (pdb) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) pdb[c] += dy[c];
      }
      if (dinp) {
        // dx = s * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - m) * s
        T g_mean = 0, g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_mean, g_xhat_mean)
        for (int64_t c = 0; c < C; ++c) {
          const T g = dy[c] * weight[c];
          g_mean += g;
          g_xhat_mean += g * (x[c] - m) * s;
        }
        g_mean /= T(C);
        g_xhat_mean /= T(C);
        T* dx = dinp + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          dx[c] += s * (dy[c] * weight[c] - g_mean - (x[c] - m) * s * g_xhat_mean);
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      for (int t = 0; t < nthreads; ++t) {
        if (dweight) dweight[c] += partial_dw[static_cast<size_t>(t * C + c)];
        if (dbias) dbias[c] += partial_db[static_cast<size_t>(t * C + c)];
      }
    }
  }
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    T sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t c = 0; c < C; ++c) sum_sq += x[c] * x[c];
    const T s = T(1) / std::sqrt(sum_sq / T(C) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    if (rstd) rstd[n] = s;
  }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C) {
  const int max_threads = omp_get_max_threads();
  std::vector<T> partial_dw(dweight ? static_cast<size_t>(max_threads * C) : 0, T(0));
#pragma omp parallel if (N * C >= kParallelMin)
  {
    const int tid = omp_get_thread_num(), nthreads = omp_get_num_threads();
    const Range rows = thread_range(N, tid, nthreads);
    T* pdw = dweight ? partial_dw.data() + tid * C : nullptr;
    for (int64_t n = rows.begin; n < rows.end; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const T s = rstd[n];
      if (pdw) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) pdw[c] += dy[c] * x[c] * s;
      }
      if (dinp) {
        // dx = s * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * s
        T g_xhat_mean = 0;
#pragma omp simd reduction(+ : g_xhat_mean)
        for (int64_t c = 0; c < C; ++c) g_xhat_mean += dy[c] * weight[c] * x[c] * s;
        g_xhat_mean /= T(C);
        T* dx = dinp + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dx[c] += s * (dy[c] * weight[c] - x[c] * s * g_xhat_mean);
      }
    }
    if (dweight) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t c = 0; c < C; ++c)
        for (int t = 0; t < nthreads; ++t) dweight[c] += partial_dw[static_cast<size_t>(t * C + c)];
    }
  }
}

#define PENTAD_INSTANTIATE(T)                                                                    \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                     T);                                                         \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                      const T*, int64_t, int64_t);                               \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);             \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t,     \
                                    int64_t);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
