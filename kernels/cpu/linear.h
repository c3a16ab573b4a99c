#pragma once
// CPU kernels of the linear layer (BLAS GEMMs), behind kernels/linear.cpp; raw pointers and
// sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be null.
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC);

// dinp (N, C) = (or +=) dout @ weight; dweight (OC, C) += dout^T @ inp; dbias (OC) += colsum(dout).
// Any of dinp, dweight, dbias may be null.
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC, bool accumulate_dinp);

}  // namespace pentad::kernels::cpu
