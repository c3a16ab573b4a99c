#pragma once
// How one rank's copy of the model is cut, as the model sees it: the model is written for one
// device and calls these hooks at the places where a cut model must talk to its other pieces.
// The defaults are one device (degree 1, every hook a no-op), so the model calls them
// unconditionally. The parallelize step (src/train/parallelize.h) installs implementations
// that run the operators of parallel/ over the mesh; nothing here knows of a communicator.
//
// Where each parallelism plugs in:
//   tensor parallelism   TensorParallelHooks: Megatron's f before every column-parallel layer
//                        (q/k/v, MLP up/gate, head) and g after every row-parallel one (o,
//                        down, the embedding); the widths shrink by degree().
//   pipeline parallelism not here: the model holds layer ranges (Model's layout) and the
//                        pipeline drives them through parallel/pp/stage.h.
//   context parallelism  a ContextParallelHooks member of Sharding, called around the
//                        attention kernels in Model::layer_forward/layer_backward (attention
//                        of this rank's sequence shard against every shard's k, v).
//   expert parallelism   an ExpertParallelHooks member of Sharding, called by an MoE block
//                        around its experts (dispatch tokens to the ranks holding their
//                        experts, combine the results back).
#include <cstdint>

#include "core/tensor.h"

namespace pentad {

// Tensor parallelism of degree p: this rank holds 1/p of the heads, of the MLP width and of
// the vocabulary. With sequence parallelism the replicated regions between f and g (norms,
// residual adds) hold a contiguous 1/p share of the b*t rows instead of all of them.
class TensorParallelHooks {
 public:
  virtual ~TensorParallelHooks() = default;
  virtual int degree() const { return 1; }
  virtual int rank() const { return 0; }
  virtual bool sequence_parallel() const { return false; }
  // Rows of the replicated regions held here: n, or n / degree with sequence parallelism.
  int64_t local_rows(int64_t n) const { return sequence_parallel() ? n / degree() : n; }

  // f, entering a column-parallel layer: the whole (n, C) input from this rank's rows (without
  // sequence parallelism full and local are one buffer and nothing moves).
  virtual void f_forward(Tensor /*full*/, const Tensor& /*local*/) {}
  // f's backward: the partial input gradient (n, C) summed over ranks into the local rows.
  virtual void f_backward(Tensor /*local*/, Tensor /*full*/) {}
  // g, leaving a row-parallel layer: partial sums (n, C) reduced into the local rows.
  virtual void g_forward(Tensor /*local*/, Tensor /*full*/) {}
  // g's backward: the output gradient's local rows made whole (n, C) on every rank.
  virtual void g_backward(Tensor /*full*/, const Tensor& /*local*/) {}
  // Element-wise sum / max over the tp ranks, in place: the vocabulary-parallel
  // cross-entropy's statistics, and gradients of replicated parameters that each rank holds
  // only a part of (norms under sequence parallelism).
  virtual void sum(Tensor /*buf*/) {}
  virtual void max(Tensor /*buf*/) {}
};

// Every cut of this rank's model; null members: not cut that way.
struct Sharding {
  TensorParallelHooks* tp = nullptr;  // not owned; outlives the model
  // Context and expert parallelism add their hooks here (see the top of this file).
};

}  // namespace pentad
