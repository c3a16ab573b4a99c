#pragma once
// CPU kernels of the token (+ position) embedding, behind kernels/embedding.cpp; raw pointers
// and sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// out (B, T, C) = wte[tokens[b, t] - vocab_start] + wpe[p(t)]; wpe may be null; p(t) =
// positions[t], or t when positions is null. wte holds V rows; a token outside
// [vocab_start, vocab_start + V) gives a zero row (plus wpe).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                       const int32_t* positions, int64_t B, int64_t T_, int64_t C,
                       int64_t vocab_start, int64_t V);
// dwte += scatter of dout rows by token (tokens outside the rows skipped); dwpe[p(t)] += sum
// over b of dout[b, t]. Either may be null.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T_, int64_t C,
                        int64_t vocab_start, int64_t V);

}  // namespace pentad::kernels::cpu
