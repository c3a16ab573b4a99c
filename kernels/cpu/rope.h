#pragma once
// CPU kernel of the rotary embedding, behind kernels/rope.cpp; raw pointers and sizes,
// checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// Rotary embedding in place on x (B, T, H, D), D even, "rotate half" pairs (i, i + D/2).
// Token t sits at position positions[t], or pos_offset + t when positions is null.
// inverse = true applies the transpose rotation (the backward pass on a gradient).
template <typename T>
void rope_apply(T* x, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t pos_offset,
                const int32_t* positions, double theta, bool inverse);

}  // namespace pentad::kernels::cpu
