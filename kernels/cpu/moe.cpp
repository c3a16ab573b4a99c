#include "kernels/cpu/moe.h"

#include <cstring>

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

#define PENTAD_MOE_KERNELS(T)                                                                   \
  template void moe_permute<T>(T*, const T*, const int32_t*, int64_t, int64_t);                 \
  template void moe_unpermute<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t,      \
                                 int64_t, bool);                                                \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, \
                                          int64_t, int64_t, int64_t);
PENTAD_MOE_KERNELS(float)
PENTAD_MOE_KERNELS(double)
#undef PENTAD_MOE_KERNELS

}  // namespace pentad::kernels::cpu
