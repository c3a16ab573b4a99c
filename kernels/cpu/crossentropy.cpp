#include "kernels/cpu/crossentropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits, const int32_t* targets,
                                   int64_t N, int64_t V, T dloss) {
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const int64_t target = targets[n];
    const T x_target = x[target];  // read before dlogits (which may be x) is written
    T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < V; ++j) max = x[j] > max ? x[j] : max;
    T sum = 0;
    if (dlogits) {
      // Keep e^(x - max) in dlogits: the second pass only scales, one exp per logit.
      T* d = dlogits + n * V;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) {
        const T e = exp_vec(x[j] - max);
        d[j] = e;
        sum += e;
      }
      const T factor = dloss / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] *= factor;
      d[target] -= dloss;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += exp_vec(x[j] - max);
    }
    if (losses) losses[n] = max + std::log(sum) - x_target;
  }
}

template void crossentropy_forward_backward<float>(float*, float*, const float*, const int32_t*,
                                                   int64_t, int64_t, float);
template void crossentropy_forward_backward<double>(double*, double*, const double*, const int32_t*,
                                                    int64_t, int64_t, double);

}  // namespace pentad::kernels::cpu
