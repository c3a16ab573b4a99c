#pragma once
// CPU kernels of causal grouped-query attention, behind kernels/attention.cpp; raw pointers
// and sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// Causal grouped-query attention. q, out (B, T, Hq, D); k, v (B, T, Hkv, D); lse (B, Hq, T)
// may be null. Scale 1/sqrt(D). Works on blocks of kAttentionBlock query rows per (b, h),
// so scratch is kAttentionBlock * T per thread, never T * T.
constexpr int64_t kAttentionBlock = 64;

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t B, int64_t T_,
                       int64_t Hq, int64_t Hkv, int64_t D);
// dq, dk, dv overwritten. Recomputes probabilities from q, k and lse.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, int64_t B, int64_t T_, int64_t Hq, int64_t Hkv,
                        int64_t D);

}  // namespace pentad::kernels::cpu
