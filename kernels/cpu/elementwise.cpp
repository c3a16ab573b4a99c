#include "kernels/cpu/elementwise.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void scale(T* x, T s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

template <typename T>
double sum_squares(const T* x, int64_t n) {
  // An OpenMP reduction clause combines partials in an unspecified order; per-thread
  // partials over static ranges, added in thread order, are reproducible.
  std::vector<double> partial(static_cast<size_t>(omp_get_max_threads()), 0.0);
  int used_threads = 1;
#pragma omp parallel if (n >= kParallelMin)
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    used_threads = omp_get_num_threads();
    const Range r = thread_range(n, tid, omp_get_num_threads());
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = r.begin; i < r.end; ++i)
      acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    partial[static_cast<size_t>(tid)] = acc;
  }
  double total = 0;
  for (int t = 0; t < used_threads; ++t) total += partial[static_cast<size_t>(t)];
  return total;
}

template <typename T>
double sum(const T* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]);
  return acc;
}

template <typename T>
void adamw_update(const T* params, const T* m, const T* v, T* params_out, T* m_out, T* v_out,
                  const T* grads, int64_t n, double lr, double beta1, double beta2, double eps,
                  double weight_decay, int64_t step) {
  // Scalars in double as Python computes them, rounded once to T as torch does.
  const double bias_c1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_c2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T decay = static_cast<T>(1.0 - lr * weight_decay);
  const T w1 = static_cast<T>(1.0 - beta1);  // lerp weight of the gradient
  const T b2 = static_cast<T>(beta2), w2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / bias_c1);
  const T bias_c2_sqrt = static_cast<T>(std::sqrt(bias_c2));
  const T epsilon = static_cast<T>(eps);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grads[i];
    T p = params[i] * decay;
    // torch's lerp: for weight < 0.5, m + w (g - m); else g - (g - m)(1 - w).
    const T mi = w1 < T(0.5) ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (T(1) - w1);
    const T vi = v[i] * b2 + w2 * g * g;  // mul_(b2).addcmul_(g, g, 1 - b2)
    const T denom = std::sqrt(vi) / bias_c2_sqrt + epsilon;
    p -= step_size * mi / denom;  // addcdiv_(m, denom, -step_size)
    m_out[i] = mi;
    v_out[i] = vi;
    params_out[i] = p;
  }
}

#define PENTAD_INSTANTIATE(T)                                                                \
  template void add<T>(T*, const T*, const T*, int64_t);                                     \
  template void scale<T>(T*, T, int64_t);                                                    \
  template double sum_squares<T>(const T*, int64_t);                                         \
  template double sum<T>(const T*, int64_t);                                                 \
  template void adamw_update<T>(const T*, const T*, const T*, T*, T*, T*, const T*, int64_t, \
                                double, double, double, double, double, int64_t);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
