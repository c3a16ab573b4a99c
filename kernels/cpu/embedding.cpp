#include "kernels/cpu/embedding.h"

#include <algorithm>

#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                       const int32_t* positions, int64_t B, int64_t T_, int64_t C,
                       int64_t vocab_start, int64_t V) {
#pragma omp parallel for schedule(static) if (B * T_ * C >= kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_start;
    const int64_t p = positions ? positions[bt % T_] : bt % T_;
    T* y = out + bt * C;
    if (row < 0 || row >= V) {
      for (int64_t c = 0; c < C; ++c) y[c] = wpe ? wpe[p * C + c] : T(0);
      continue;
    }
    const T* tok = wte + row * C;
    if (wpe) {
      const T* pos = wpe + p * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = tok[c] + pos[c];
    } else {
      std::copy(tok, tok + C, y);
    }
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T_, int64_t C,
                        int64_t vocab_start, int64_t V) {
  // Repeated tokens (or positions) add into the same row, so threads split channels, not
  // tokens: each owns a slice of every row and visits tokens in order. Race-free, and the
  // sum order does not depend on the thread count.
  constexpr int64_t kSlice = 64;
  const int64_t slices = (C + kSlice - 1) / kSlice;
  if (dwte) {
#pragma omp parallel for schedule(static) if (B * T_ * C >= kParallelMin)
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
      for (int64_t bt = 0; bt < B * T_; ++bt) {
        const int64_t r = static_cast<int64_t>(tokens[bt]) - vocab_start;
        if (r < 0 || r >= V) continue;
        T* row = dwte + r * C;
        const T* g = dout + bt * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
      }
    }
  }
  if (dwpe && positions) {
#pragma omp parallel for schedule(static) if (B * T_ * C >= kParallelMin)
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
      for (int64_t t = 0; t < T_; ++t) {
        T* row = dwpe + static_cast<int64_t>(positions[t]) * C;
        for (int64_t b = 0; b < B; ++b) {
          const T* g = dout + (b * T_ + t) * C;
#pragma omp simd
          for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
        }
      }
    }
  } else if (dwpe) {
#pragma omp parallel for schedule(static) if (B * T_ * C >= kParallelMin)
    for (int64_t t = 0; t < T_; ++t) {
      T* row = dwpe + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const T* g = dout + (b * T_ + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) row[c] += g[c];
      }
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*,
                                       const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*,
                                        const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*,
                                        const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*,
                                         const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                         int64_t);

}  // namespace pentad::kernels::cpu
