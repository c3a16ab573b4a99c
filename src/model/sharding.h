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
//   context parallelism  ContextParallelHooks: this rank holds t of the sequence's tokens
//                        (positions() says which, for RoPE and learned positions), and
//                        attention of its queries against every rank's keys replaces the
//                        attention kernels in Model::layer_forward/layer_backward.
//   expert parallelism   an ExpertParallelHooks member of Sharding, called by an MoE block
//                        around its experts (dispatch tokens to the ranks holding their
//                        experts, combine the results back).
#include <cstdint>
#include <vector>

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
  // 2D tensor parallelism (parallel/tp/tensor_parallel.h): the tp ranks as a d1 x d2 mesh;
  // heads and the MLP width split over d1, the model width C of each layer's matrices over
  // d2. The defaults are 1D: d1 = degree(), d2 = 1, and the layer operations are f and g.
  virtual int heads_degree() const { return degree(); }
  virtual int heads_rank() const { return rank(); }
  virtual int hidden_degree() const { return 1; }
  virtual int hidden_rank() const { return 0; }
  // A layer's f forward (and g backward): columns j (n, C/d2) of the whole rows.
  virtual void gather_hidden(Tensor full_j, const Tensor& local) { f_forward(full_j, local); }
  // A layer's g forward (and f backward): partial sums (n, C/d2) into this rank's rows.
  virtual void reduce_hidden(Tensor local, Tensor partial_j) { g_forward(local, partial_j); }
  // Sum over the d2 ranks, in place: a column-parallel GEMM's output, a row-parallel GEMM's
  // input gradient.
  virtual void all_reduce_hidden(Tensor /*buf*/) {}
  // Chunk-based overlap (2D): a GEMM whose output is summed over the d2 ranks runs in
  // chunks() row pieces, each piece's sum started (begin_hidden_sum) as its GEMM ends, all
  // finished by end_hidden_sums() before anything reads them.
  virtual int chunks() const { return 1; }
  virtual void begin_hidden_sum(Tensor buf) { all_reduce_hidden(buf); }
  virtual void end_hidden_sums() {}
  // Element-wise sum / max over the tp ranks, in place: the vocabulary-parallel
  // cross-entropy's statistics, and gradients of replicated parameters that each rank holds
  // only a part of (norms under sequence parallelism).
  virtual void sum(Tensor /*buf*/) {}
  virtual void max(Tensor /*buf*/) {}
};

// One micro-batch's dispatch in one MoE layer. The block fills `send` (its permuted rows
// per global expert, experts in order); plan() fills the rest.
struct ExpertRoute {
  std::vector<int64_t> send;  // rows this rank sends, per global expert (E)
  std::vector<int64_t> rows;  // rows each local expert computes after dispatch
  int64_t recv_rows = 0;      // sum of rows: the experts' input, grouped by local expert
  std::vector<int64_t> recv;  // the hooks' own bookkeeping (counts per source and expert)
};

// Expert parallelism: this rank holds experts [first_expert, first_expert + n / ep_degree)
// of every MoE layer, each one's width split over etp_degree ranks (up/gate by rows, down by
// columns, as Megatron's column/row parallel). dispatch() sends every rank's permuted rows
// to the ranks holding their experts, grouped there by local expert; combine() sums the
// experts' partial outputs over etp and sends them back, in the order they were sent.
// Backward uses the same two: gradients of outputs travel like inputs (dispatch), gradients
// of inputs like outputs (combine). The defaults are one device: every expert local, both
// a copy.
class ExpertParallelHooks {
 public:
  virtual ~ExpertParallelHooks() = default;
  virtual int ep_degree() const { return 1; }
  virtual int ep_rank() const { return 0; }
  virtual int etp_degree() const { return 1; }
  virtual int etp_rank() const { return 0; }
  int64_t local_experts(int64_t n) const { return n / ep_degree(); }
  int64_t first_expert(int64_t n) const { return ep_rank() * local_experts(n); }

  // A dispatch will deliver at most `received` rows of C values in `dtype` on `device` here
  // (moe_row_bound): buffers made for them now, so none grows during training.
  virtual void reserve(double received, int64_t C, Device device, DType dtype) {}
  // Fills route.rows, recv_rows and recv from route.send (exchanging counts).
  virtual void plan(ExpertRoute& route);
  // in: (sum of send, C) rows in expert order; out: (recv_rows, C).
  virtual void dispatch(const ExpertRoute& route, const Tensor& in, Tensor out);
  // in: (recv_rows, C) partial outputs (this etp rank's share of the width); out: (sum of
  // send, C), whole, in the order dispatch() took them.
  virtual void combine(const ExpertRoute& route, const Tensor& in, Tensor out);
};

// Context parallelism of degree p: this rank holds t = seq_len / p tokens of every sequence
// of the micro-batch, at the global positions positions() lists (ascending). The defaults
// are one device: every position, the attention kernels.
class ContextParallelHooks {
 public:
  virtual ~ContextParallelHooks() = default;
  virtual int degree() const { return 1; }
  // I32 (t) on the compute device; absent: 0..t-1.
  virtual Tensor positions() const { return {}; }
  virtual size_t scratch_bytes() const { return 0; }  // buffers the hooks hold
  virtual int rank() const { return 0; }
  virtual std::vector<int32_t> host_positions() const { return {}; }  // positions() on the host
  // Element-wise sum over the cp ranks, in place: statistics of a whole micro-batch (MoE).
  virtual void sum(Tensor /*buf*/) {}
  // q, out (b, t, hq, d); k, v (b, t, hkv, d), RoPE applied: causal attention of this rank's
  // queries to the whole sequence. lse holds b*hq*t values for backward.
  virtual void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                 const Tensor& v);
  // dq, dk, dv (this rank's tokens) overwritten.
  virtual void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                  const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse);
};

// Every cut of this rank's model; null members: not cut that way.
// ZeRO-3 (parameters sharded over the data-parallel ranks): a parameter is whole on this
// rank only between need() and done() of a call naming it. The model names the parameters
// of each stretch of work (the embedding, a layer, the final norm and head) around it, in
// the order it runs them (backward: from the head towards the embedding), so that an
// implementation can fetch the next stretch's while this one computes.
class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;
  virtual void need(const std::vector<int>& /*ids*/, bool /*backward*/) {}
  virtual void done(const std::vector<int>& /*ids*/) {}
};

struct Sharding {
  TensorParallelHooks* tp = nullptr;   // not owned; outlives the model
  ExpertParallelHooks* ep = nullptr;   // not owned; outlives the model
  ContextParallelHooks* cp = nullptr;  // not owned; outlives the model
};

}  // namespace pentad
