#pragma once
// CPU kernels of causal grouped-query attention, behind kernels/attention.cpp; raw pointers
// and sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// Causal grouped-query attention by position. q, out (B, Tq, Hq, D); k, v (B, Tk, Hkv, D);
// lse (B, Hq, Tq) may be null. q_pos (Tq) and k_pos (Tk) are ascending positions, both null
// for 0..T-1 (then Tq == Tk). Query i sees the keys j with k_pos[j] <= q_pos[i], a prefix
// of the keys; a query that sees none gets out = 0 and lse = -inf. Scale 1/sqrt(D). Works
// on blocks of at most kAttentionBlock query rows per (b, h), cut where q_pos jumps (a
// zig-zag rank's two chunks), so scratch is kAttentionBlock * Tk per thread, never Tq * Tk.
constexpr int64_t kAttentionBlock = 64;

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* q_pos,
                       const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                       int64_t Hkv, int64_t D);
// The backward of one (q, k/v) block given the final out and lse of the query rows:
// recomputes probabilities from q, k and lse. dq, dk, dv are overwritten, or added to when
// accumulate is true.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                        int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                        bool accumulate);
// Merges a block's (block_out, block_lse) into the running (out, lse) by log-sum-exp, in
// place. out, block_out (B, T, H, D); lse, block_lse (B, H, T).
template <typename T>
void attention_merge(T* out, T* lse, const T* block_out, const T* block_lse, int64_t B, int64_t T_,
                     int64_t H, int64_t D);

}  // namespace pentad::kernels::cpu
