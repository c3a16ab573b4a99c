#include "kernels/cpu/activations.h"

#include <cmath>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

namespace {
// sqrt(2 / pi) and the cubic coefficient of the tanh approximation.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  const T s = T(kGeluScale), k = T(kGeluCubic);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + tanh_vec(s * (x + k * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, int64_t n) {
  const T s = T(kGeluScale), k = T(kGeluCubic);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T th = tanh_vec(s * (x + k * x * x * x));
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3) * k * x * x);
    dinp[i] = grad * dout[i];
  }
}

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + exp_vec(-g)) * up[i];
  }
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], u = up[i], dy = dout[i];
    const T sig = T(1) / (T(1) + exp_vec(-g));
    // d silu(g) / dg = sig * (1 + g * (1 - sig)); every input is read before either write, so
    // dgate and dup may alias any input.
    const T dg = dy * u * sig * (T(1) + g * (T(1) - sig)), du = dy * g * sig;
    if (dgate) dgate[i] = dg;
    if (dup) dup[i] = du;
  }
}

#define PENTAD_INSTANTIATE(T)                                       \
  template void gelu_forward<T>(T*, const T*, int64_t);             \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);  \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t); \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
