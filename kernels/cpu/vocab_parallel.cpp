#include "kernels/cpu/vocab_parallel.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void vocab_parallel_ce_max(T* row_max, const T* logits, int64_t N, int64_t Vl) {
#pragma omp parallel for schedule(static) if (N * Vl >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * Vl;
    T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < Vl; ++j) max = x[j] > max ? x[j] : max;
    row_max[n] = max;
  }
}

template <typename T>
void vocab_parallel_ce_stats(T* stats, const T* logits, const T* row_max, const int32_t* targets,
                             int64_t N, int64_t Vl, int64_t vocab_start) {
#pragma omp parallel for schedule(static) if (N * Vl >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * Vl;
    const T max = row_max[n];
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < Vl; ++j) sum += exp_vec(x[j] - max);
    stats[n] = sum;
    const int64_t local = targets[n] - vocab_start;
    stats[N + n] = local >= 0 && local < Vl ? x[local] : T(0);
  }
}

template <typename T>
void vocab_parallel_ce_finish(T* losses, T* dlogits, const T* logits, const T* row_max,
                              const T* stats, const int32_t* targets, int64_t N, int64_t Vl,
                              int64_t vocab_start, T dloss) {
#pragma omp parallel for schedule(static) if (N * Vl >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T max = row_max[n], sum = stats[n];
    if (losses) losses[n] = max + std::log(sum) - stats[N + n];
    if (!dlogits) continue;
    const T* x = logits + n * Vl;
    T* d = dlogits + n * Vl;
    const T factor = dloss / sum;
#pragma omp simd
    for (int64_t j = 0; j < Vl; ++j) d[j] = exp_vec(x[j] - max) * factor;
    const int64_t local = targets[n] - vocab_start;
    if (local >= 0 && local < Vl) d[local] -= dloss;
  }
}

#define PENTAD_INSTANTIATE(T)                                                                     \
  template void vocab_parallel_ce_max<T>(T*, const T*, int64_t, int64_t);                         \
  template void vocab_parallel_ce_stats<T>(T*, const T*, const T*, const int32_t*, int64_t,       \
                                           int64_t, int64_t);                                     \
  template void vocab_parallel_ce_finish<T>(T*, T*, const T*, const T*, const T*, const int32_t*, \
                                            int64_t, int64_t, int64_t, T);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
