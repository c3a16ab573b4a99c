#pragma once
// CPU kernels of LayerNorm and RMSNorm, behind kernels/norms.cpp; raw pointers and sizes,
// checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// LayerNorm over rows of inp (N, C). mean, rstd (N) may be null (inference); bias may be null.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, T eps);
// dinp +=, dweight +=, dbias +=; any of them may be null.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C);

// RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps). rstd may be null.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C, T eps);
// dinp +=, dweight +=; either may be null.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t N, int64_t C);

}  // namespace pentad::kernels::cpu
