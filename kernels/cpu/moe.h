#pragma once
// CPU kernels of the MoE token permutation (kernels/moe.cpp): rows gathered into expert
// order and combined back per token. Raw pointers and sizes, checked at the door.
#include <cstdint>

namespace pentad::kernels::cpu {

// out[a] = inp[src[a]] for a < A; rows of C.
template <typename T>
void moe_permute(T* out, const T* inp, const int32_t* src, int64_t A, int64_t C);
// out[t] (+)= sum_j w[t, j] * inp[pos[t, j]] over the k picks of token t whose pos >= 0;
// w absent (null): weight 1. Overwrites out unless accumulate.
template <typename T>
void moe_unpermute(T* out, const T* inp, const int32_t* pos, const T* w, int64_t N, int64_t k,
                   int64_t C, bool accumulate);
// The backward of moe_unpermute with weights: dinp[pos[t, j]] = w[t, j] * dout[t] and
// dw[t, j] = <dout[t], inp[pos[t, j]]> (0 for a dropped pick, pos < 0).
template <typename T>
void moe_unpermute_backward(T* dinp, T* dw, const T* dout, const T* inp, const int32_t* pos,
                            const T* w, int64_t N, int64_t k, int64_t C);

}  // namespace pentad::kernels::cpu
