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

// Linear layers of G groups of consecutive rows (rows[g] each; kernels/ops.h): out rows =
// inp rows @ weight[g]^T + bias[g] (bias or bias[g] null: none). inp (R, C), out (R, OC),
// weight[g] (OC, C).
template <typename T>
void grouped_linear_forward(T* out, const T* inp, const int64_t* rows, const T* const* weight,
                            const T* const* bias, int64_t G, int64_t C, int64_t OC);
// dinp (+)= dout @ weight[g]; dweight[g] += dout^T @ inp; dbias[g] += column sums of dout,
// each over group g's rows. Any of dinp, dweight, dbias (or one group's entry) may be null.
template <typename T>
void grouped_linear_backward(T* dinp, T* const* dweight, T* const* dbias, const T* dout,
                             const T* inp, const int64_t* rows, const T* const* weight, int64_t G,
                             int64_t C, int64_t OC, bool accumulate_dinp);

}  // namespace pentad::kernels::cpu
