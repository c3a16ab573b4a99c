#pragma once
// CPU kernels of the activations (GELU, SwiGLU), behind kernels/activations.cpp. Like every
// header here: raw pointers and sizes, checked at the door (kernels/door.h says why).
#include <cstdint>

namespace pentad::kernels::cpu {

// GELU, tanh approximation, elementwise over n values. dinp is overwritten.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, int64_t n);

// SwiGLU: out = silu(gate) * up, elementwise over n values. dgate, dup overwritten (either may be
// null).
template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n);
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n);

}  // namespace pentad::kernels::cpu
