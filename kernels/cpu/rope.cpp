#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void rope_apply(T* x, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t pos_offset,
                const int32_t* positions, double theta, bool inverse) {
  const int64_t half = D / 2;
  // cos/sin table (T_, half): angles in double, then rounded once, so float results sit
  // within an ulp of PyTorch's.
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  std::vector<T> cos_table(static_cast<size_t>(T_ * half)), sin_table(cos_table.size());
#pragma omp parallel for schedule(static) if (T_ * half >= kParallelMin)
  for (int64_t t = 0; t < T_; ++t) {
    const int64_t pos = positions ? positions[t] : pos_offset + t;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[static_cast<size_t>(i)];
      cos_table[static_cast<size_t>(t * half + i)] = static_cast<T>(std::cos(angle));
      sin_table[static_cast<size_t>(t * half + i)] = static_cast<T>(std::sin(angle));
    }
  }
  // Forward: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. Inverse: sin -> -sin.
  const T sign = inverse ? T(-1) : T(1);
#pragma omp parallel for schedule(static) if (B * T_ * H * D >= kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = bt % T_;
    const T* c = cos_table.data() + t * half;
    const T* s = sin_table.data() + t * half;
    for (int64_t h = 0; h < H; ++h) {
      T* x1 = x + (bt * H + h) * D;
      T* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = x1[i], b = x2[i], si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

template void rope_apply<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                double, bool);
template void rope_apply<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 const int32_t*, double, bool);

}  // namespace pentad::kernels::cpu
