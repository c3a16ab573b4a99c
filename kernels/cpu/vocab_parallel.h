#pragma once
// CPU kernels of vocabulary-parallel cross-entropy (the three local phases), behind
// kernels/crossentropy.cpp; raw pointers and sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// Cross-entropy over logits (N, Vl) that hold vocabulary columns [vocab_start, vocab_start + Vl)
// of the whole row, in three local phases around two reductions over the shards.
template <typename T>
void vocab_parallel_ce_max(T* row_max, const T* logits, int64_t N, int64_t Vl);
// stats (2, N): [0][n] = sum_j exp(logit - row_max), [1][n] = the target's logit if local, else 0.
template <typename T>
void vocab_parallel_ce_stats(T* stats, const T* logits, const T* row_max, const int32_t* targets,
                             int64_t N, int64_t Vl, int64_t vocab_start);
template <typename T>
void vocab_parallel_ce_finish(T* losses, T* dlogits, const T* logits, const T* row_max,
                              const T* stats, const int32_t* targets, int64_t N, int64_t Vl,
                              int64_t vocab_start, T dloss);

}  // namespace pentad::kernels::cpu
