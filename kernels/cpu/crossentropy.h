#pragma once
// CPU kernel of softmax cross-entropy fused with its gradient, behind
// kernels/crossentropy.cpp; raw pointers and sizes, checked at the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// Softmax cross-entropy over rows of logits (N, V) with targets (N), 0 <= target < V.
// losses (N) = logsumexp(row) - row[target], may be null. dlogits (N, V) =
// (softmax - onehot) * dloss, may be null, may alias logits.
template <typename T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits, const int32_t* targets,
                                   int64_t N, int64_t V, T dloss);

}  // namespace pentad::kernels::cpu
