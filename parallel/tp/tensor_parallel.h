#pragma once
// The communication of Megatron tensor parallelism over one tp group, named as in the
// paper: f is the identity forward and an all-reduce backward (before a column-parallel
// layer), g is an all-reduce forward and the identity backward (after a row-parallel
// layer). With sequence parallelism, the replicated regions between them (norms, residual
// adds) hold a contiguous 1/tp share of the b*t rows instead: g becomes a reduce-scatter
// of rows and f's forward an all-gather of rows (their transposes in backward).
// With degree 1 every operation is a no-op, so the model calls them unconditionally.
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
  // Rows of the replicated regions held here: n, or n / degree with sequence parallelism.
  int64_t local_rows(int64_t n) const { return sequence_parallel_ ? n / degree() : n; }

  // Entering a column-parallel layer: full (n, C) input from this rank's rows.
  // Without SP full and local are the same buffer and nothing moves.
  void enter_forward(Tensor full, const Tensor& local);
  // Its backward: the partial input gradient (n, C) summed over ranks into local rows.
  void enter_backward(Tensor local, Tensor full);
  // Leaving a row-parallel layer: partial sums (n, C) reduced into local rows.
  void exit_forward(Tensor local, Tensor full);
  // Its backward: the output gradient's local rows made whole (n, C) on every rank.
  void exit_backward(Tensor full, const Tensor& local);

  void all_reduce(Tensor buf, ReduceOp op = ReduceOp::Sum);

 private:
  Communicator* group_ = nullptr;
  bool sequence_parallel_ = false;
};

}  // namespace pentad::parallel
