#pragma once
// The communication of Megatron tensor parallelism over one tp group, named as in the paper
// (Shoeybi et al. 2019): f is the identity forward and an all-reduce backward (before a
// column-parallel layer), g an all-reduce forward and the identity backward (after a
// row-parallel layer). With sequence parallelism (Korthikanti et al. 2022) the replicated
// regions between them (norms, residual adds) hold a contiguous 1/tp share of the b*t rows
// instead, and f and g become the paper's pair of an all-gather of rows and a reduce-scatter
// of rows (f: all-gather forward, reduce-scatter backward; g: the reverse).
//
// 2D tensor parallelism (the column- and row-first forms of ATP, Cheng et al. 2023): the tp
// ranks form a d1 x d2 mesh; rank (i, j) holds block (i, j) of every layer's matrices:
// a column-parallel weight (out, C) cut into out/d1 rows and C/d2 columns, a row-parallel
// one (C, in) into C/d2 rows and in/d1 columns. So heads and the MLP width split over d1
// ("heads" groups: the d1 ranks sharing j), the model width C over d2 ("hidden" groups: the
// d2 ranks sharing i). A layer then needs, around each pair of GEMMs:
//   gather_hidden:  whole rows, columns j of the block's input, from this rank's rows
//                   (what f forward is in 1D; also g backward);
//   column GEMM, then all_reduce_hidden of its (n, out/d1) partial sums over the d2 ranks;
//   row GEMM (n, C/d2) partial over the d1 ranks, then reduce_hidden: summed over the d1
//                   ranks and put back into this rank's rows, all columns (g forward; also
//                   f backward);
//   backward of the row GEMM: all_reduce_hidden of its input gradient (n, in/d1).
// So the d1 ranks exchange n*C/d2 values where 1D tp exchanges n*C over all of them: with
// the slower links along d1, they carry less. Attention (heads over d1) and the element-wise
// ops between the two GEMMs are computed by all d2 ranks of a heads group alike.
// The vocabulary-parallel embedding and head stay 1D over all tp ranks (f/g below), in the
// mesh's logical order (rank = i * d2 + j), which sequence parallelism's rows follow too.
// With degree 1 every operation is a no-op; with d2 = 1 the 2D operations are f and g.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace pentad::parallel {

class TensorParallel {
 public:
  TensorParallel() = default;  // degree 1
  TensorParallel(Communicator* group, bool sequence_parallel);
  // 2D: `all` holds every tp rank in logical order; `heads` the d1 ranks sharing this one's
  // j (group rank i), `hidden` the d2 ranks sharing its i (group rank j).
  TensorParallel(Communicator* all, Communicator* heads, Communicator* hidden,
                 bool sequence_parallel);

  int degree() const { return group_ ? group_->size() : 1; }
  int rank() const { return group_ ? group_->rank() : 0; }
  bool sequence_parallel() const { return sequence_parallel_; }
  int heads_degree() const { return hidden_ ? heads_->size() : degree(); }  // d1
  int heads_rank() const { return hidden_ ? heads_->rank() : rank(); }      // i
  int hidden_degree() const { return hidden_ ? hidden_->size() : 1; }       // d2
  int hidden_rank() const { return hidden_ ? hidden_->rank() : 0; }         // j

  // f forward: the whole (n, C) input of a column-parallel layer from this rank's rows.
  // Without sequence parallelism full and local are the same buffer and nothing moves.
  void f_forward(Tensor full, const Tensor& local);
  // f backward: the partial input gradient (n, C) summed over ranks into the local rows.
  void f_backward(Tensor local, Tensor full);
  // g forward: a row-parallel layer's partial sums (n, C) reduced into the local rows.
  void g_forward(Tensor local, Tensor full);
  // g backward: the output gradient's local rows made whole (n, C) on every rank.
  void g_backward(Tensor full, const Tensor& local);

  // 2D (see above; with d2 = 1: f_forward and g_forward). full_j is (n, C/d2), local is
  // this rank's (rows, C).
  void gather_hidden(Tensor full_j, const Tensor& local);
  void reduce_hidden(Tensor local, Tensor partial_j);
  // Over the d2 ranks; no-op with d2 = 1. async: started now, finished by wait_hidden()
  // (chunk-based overlap: a GEMM's pieces each start their sum as they end).
  void all_reduce_hidden(Tensor buf, bool async = false);
  void wait_hidden();

  // Element-wise over the group, in place (the vocabulary-parallel cross-entropy's row max
  // and sums; gradients of replicated parameters each rank holds a part of).
  void all_reduce(Tensor buf, ReduceOp op = ReduceOp::Sum);

  size_t scratch_bytes() const { return scratch_.capacity(); }

 private:
  Tensor scratch(int which, Shape shape, const Tensor& like);  // two buffers, grown on demand
  Communicator* group_ = nullptr;
  Communicator* heads_ = nullptr;   // 2D only
  Communicator* hidden_ = nullptr;  // 2D only (null: 1D)
  bool sequence_parallel_ = false;
  Arena scratch_;
  std::vector<Work> pending_;  // async hidden sums not yet waited for
  size_t scratch_half_ = 0;
};

}  // namespace pentad::parallel
