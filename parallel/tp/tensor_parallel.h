#pragma once
// The communication of Megatron tensor parallelism over one tp group, named as in the paper
// (Shoeybi et al. 2019): f is the identity forward and an all-reduce backward (before a
// column-parallel layer), g an all-reduce forward and the identity backward (after a
// row-parallel layer). With sequence parallelism (Korthikanti et al. 2022) the replicated
// regions between them (norms, residual adds) hold a contiguous 1/tp share of the b*t rows
// instead, and f and g become the paper's pair of an all-gather of rows and a reduce-scatter
// of rows (f: all-gather forward, reduce-scatter backward; g: the reverse).
// These operators work on tensors and a communicator and know nothing of any model; the
// parallelize step (src/train/parallelize.h) connects them to the model's hooks.
// With degree 1 every operation is a no-op.
#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace pentad::parallel {

class TensorParallel {
 public:
  TensorParallel() = default;  // degree 1
  TensorParallel(Communicator* group, bool sequence_parallel);

  int degree() const { return group_ ? group_->size() : 1; }
  int rank() const { return group_ ? group_->rank() : 0; }
  bool sequence_parallel() const { return sequence_parallel_; }

  // f forward: the whole (n, C) input of a column-parallel layer from this rank's rows.
  // Without sequence parallelism full and local are the same buffer and nothing moves.
  void f_forward(Tensor full, const Tensor& local);
  // f backward: the partial input gradient (n, C) summed over ranks into the local rows.
  void f_backward(Tensor local, Tensor full);
  // g forward: a row-parallel layer's partial sums (n, C) reduced into the local rows.
  void g_forward(Tensor local, Tensor full);
  // g backward: the output gradient's local rows made whole (n, C) on every rank.
  void g_backward(Tensor full, const Tensor& local);

  // Element-wise over the group, in place (the vocabulary-parallel cross-entropy's row max
  // and sums; gradients of replicated parameters each rank holds a part of).
  void all_reduce(Tensor buf, ReduceOp op = ReduceOp::Sum);

 private:
  Communicator* group_ = nullptr;
  bool sequence_parallel_ = false;
};

}  // namespace pentad::parallel
