#pragma once
#include <cstdint>

namespace pentad::kernels::cpu {

// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; wpe may be null. Tokens are in range.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                       int64_t T_, int64_t C);
// dwte += scatter of dout rows by token; dwpe[t] += sum over b of dout[b, t]. Either may be null.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                        int64_t T_, int64_t C);

}  // namespace pentad::kernels::cpu
