// The split backward's blocks (model/split_backward.cpp) under tensor and context
// parallelism: each is Model::layer_backward's (model/model.cpp) cut in two, B making every
// collective the input gradient needs, in the same order and on the same values, W only
// GEMMs and norms. So every gradient stays bitwise the fused backward's at the same layout.
//
// Tensor parallelism (Megatron's f and g; 2D's gather_hidden, reduce_hidden and the d2
// sums). B, per block:
//   g backward: d(block output)'s rows made whole (N, Cj): without sequence parallelism
//     straight into the slot's DeferredGrads (d_out, d_att_out), where W reads them as the
//     row-parallel GEMM's output gradient; under sequence parallelism into the scratch, and
//     this rank's rows (Nl, C) into DeferredGrads, which W gathers again (an all-gather a
//     row-parallel GEMM in W, as Megatron's sequence parallelism gathers a column-parallel
//     GEMM's input again in backward): so the kept rows fit over the slot's activations and
//     a slot waiting for W holds no more than 1F1B's;
//   the row-parallel GEMM's input gradient, in 2D summed over the d2 ranks piece by piece
//     (parallel.tp_chunks), as the fused backward's;
//   f backward: the column-parallel GEMMs' partial input gradients summed over tp into this
//     rank's rows (the scratch's d_norm_local), which the norms' backward, wholly B's, reads.
// W: the same GEMMs' weight gradients (under sequence parallelism from the output gradients
// gathered again), in 2D added up over the same row pieces. Replicated
// parameters whose gradients are partial per tp rank (norms under sequence parallelism, their
// gradients added by B) are summed at the last micro-batch's W, as backward_chunk sums them
// at its last backward. The column-parallel GEMMs' output gradients (this rank's heads and
// MLP columns, whole rows: no collective between them and W) are kept over the activations
// they replace (split_backward.cpp).
// The head and the embedding are 1D over every tp rank: the head's f backward in B, the
// embedding's g backward (the rows made whole under sequence parallelism) in W.
//
// Context parallelism: attention's backward (Ulysses all-to-alls, ring K/V and dK/dV
// transfers) is wholly B's; RoPE and the embedding read this rank's positions. W does the
// GEMMs, which need nothing from other cp ranks.
#include "kernels/ops.h"
#include "model/model.h"

namespace pentad {

namespace k = kernels;

// Views of (N, width) buffers as (b, t, heads, head_dim) for attention and RoPE (model.cpp's
// heads(), named apart for the unity build).
static Tensor heads_of(const Tensor& x, int64_t b, int64_t t, int64_t d) {
  return x.reshaped(Shape{b, t, x.dim(1) / d, d});
}

// Without sequence parallelism the whole rows are what W keeps (2D: columns j, gathered over
// the d2 ranks; else a copy of the rows, since the fused backward's g is the identity). Under
// sequence parallelism W keeps this rank's rows (Nl, C), which fit over the activation they
// are written on, and gathers them again: the scratch's d_full holds the whole rows in B and
// in W (a pass uses it alone).
Tensor Model::keep_output_grad(const Tensor& kept, const Tensor& local) {
  if (!tp_->sequence_parallel()) {
    if (apart_)
      tp_->gather_hidden(kept, local);
    else
      copy(kept, local);
    return kept;
  }
  copy(kept, local);
  return kept_output_grad(kept);
}

Tensor Model::kept_output_grad(const Tensor& kept) {
  if (!tp_->sequence_parallel()) return kept;
  const Tensor full = scratch_.grads.full.prefix(Shape{b_ * t_, width_});
  tp_->gather_hidden(full, kept);
  return full;
}

// The column-parallel GEMMs' partial input gradient (N, Cj), before f's backward reduces it
// into `reduced` (Nl, C): the scratch when the two differ, else `reduced` itself (1D tp
// without sequence parallelism: an all-reduce in place, as the fused backward's).
Tensor Model::column_input_partial(const Tensor& reduced) const {
  return apart_ ? scratch_.grads.norm.prefix(Shape{b_ * t_, width_}) : reduced;
}

// A dense MLP's B (model.cpp's mlp_backward without its weight gradients): g.resid holds
// d(layer output); d(norm2 output) lands in g.norm_local, the down projection's output
// gradient in d, d(pre-activation) (and d(gate)) over a.up (a.gate): the activation's
// backward reads each pre-activation just before it writes that value's gradient in its
// place, so nothing is copied. (The fused backward's GELU step is the same two kernels on the
// CPU; on CUDA it is the GEMM's DGELU epilogue there, a kernel of its own here.)
void Model::split_mlp_input(const LayerParams& p, LayerActs& a, int64_t ffn,
                            const DeferredGrads& d) {
  PENTAD_CHECK(ffn > 0, "split backward: an MLP of width 0");
  const LayerGrads& g = scratch_.grads;
  const Tensor a_up = at_width(a.up, ffn), a_gate = at_width(a.gate, ffn),
               a_act = at_width(a.act, ffn);
  const Tensor act = at_width(g.act, ffn);
  const Tensor partial = column_input_partial(g.norm_local);
  // The down projection's output gradient, whole rows; in 2D the activation's gradient is
  // summed over the d2 ranks before the activation's backward.
  const Tensor d_out = keep_output_grad(d.d_out, g.resid);
  if (tp_->hidden_degree() > 1) {
    row_gemm_backward(act, Tensor{}, Tensor{}, d_out, a_act, P(p.down_w));
    tp_->end_hidden_sums();
  } else {
    k::linear_backward(act, Tensor{}, Tensor{}, d_out, Tensor{}, P(p.down_w), false);
  }
  if (gpt2()) {
    k::gelu_backward(a_up, act, a_up);
  } else {
    k::swiglu_backward(a_gate, a_up, act, a_gate, a_up);
    k::linear_backward(partial, Tensor{}, Tensor{}, a_gate, Tensor{}, P(p.gate_w), false);
  }
  k::linear_backward(partial, Tensor{}, Tensor{}, a_up, Tensor{}, P(p.up_w), !gpt2());
  tp_->reduce_hidden(g.norm_local, partial);
}

// A dense MLP's W: down (in 2D over the same row pieces as the fused backward), gate, up;
// a.up and a.gate hold B's d(up), d(gate).
void Model::split_mlp_weights(const LayerParams& p, const LayerActs& a, int64_t ffn,
                              const DeferredGrads& d) {
  row_gemm_backward(Tensor{}, G(p.down_w), G(p.down_b), kept_output_grad(d.d_out),
                    at_width(a.act, ffn), P(p.down_w), false);
  if (!gpt2())
    k::linear_backward(Tensor{}, G(p.gate_w), Tensor{}, at_width(a.gate, ffn), a.norm2, P(p.gate_w),
                       false);
  k::linear_backward(Tensor{}, G(p.up_w), G(p.up_b), at_width(a.up, ffn), a.norm2, P(p.up_w),
                     false);
}

// The attention block's B: g.resid holds d(res1); the output projection's output gradient
// lands in d, attention's (every cp rank's part included) in the scratch's g.q, g.k, g.v
// (attention's backward reads a.q, a.k, a.v whole as it writes them), d(norm1 output) in
// g.norm_local.
void Model::split_attention_input(const LayerParams& p, LayerActs& a, const DeferredGrads& d) {
  const int64_t dh = cfg_.head_dim();
  const LayerGrads& g = scratch_.grads;
  const Tensor d_att_out = keep_output_grad(d.d_att_out, g.resid);
  // As layer_backward's, the layout test's planted bug included.
  row_gemm_backward(g.att, Tensor{}, Tensor{}, d_att_out, a.att, P(p.o_w),
                    !bug_injected("tp2d-skip-hidden-grad-sum"));
  tp_->end_hidden_sums();
  cp_->attention_backward(heads_of(g.q, b_, t_, dh), heads_of(g.k, b_, t_, dh),
                          heads_of(g.v, b_, t_, dh), heads_of(g.att, b_, t_, dh),
                          heads_of(a.q, b_, t_, dh), heads_of(a.k, b_, t_, dh),
                          heads_of(a.v, b_, t_, dh), heads_of(a.att, b_, t_, dh), a.lse);
  if (!gpt2()) {
    k::rope_backward(heads_of(g.q, b_, t_, dh), 0, cfg_.rope_theta, cp_->positions());
    k::rope_backward(heads_of(g.k, b_, t_, dh), 0, cfg_.rope_theta, cp_->positions());
  }
  // For W, d(q), d(k), d(v) stay in the scratch's buffers, which the layer's q, k, v (read no
  // more) then replace (keep_attention_grads).
  const Tensor partial = column_input_partial(g.norm_local);
  k::linear_backward(partial, Tensor{}, Tensor{}, g.q, Tensor{}, P(p.q_w), false);
  k::linear_backward(partial, Tensor{}, Tensor{}, g.k, Tensor{}, P(p.k_w), true);
  k::linear_backward(partial, Tensor{}, Tensor{}, g.v, Tensor{}, P(p.v_w), true);
  tp_->reduce_hidden(g.norm_local, partial);
}

// The attention block's W: the output projection (in 2D over the fused backward's row
// pieces), then q, k, v from B's d(q), d(k), d(v) in a.q, a.k, a.v.
void Model::split_attention_weights(const LayerParams& p, const LayerActs& a,
                                    const DeferredGrads& d) {
  row_gemm_backward(Tensor{}, G(p.o_w), G(p.o_b), kept_output_grad(d.d_att_out), a.att, P(p.o_w),
                    false);
  k::linear_backward(Tensor{}, G(p.q_w), G(p.q_b), a.q, a.norm1, P(p.q_w), false);
  k::linear_backward(Tensor{}, G(p.k_w), G(p.k_b), a.k, a.norm1, P(p.k_w), false);
  k::linear_backward(Tensor{}, G(p.v_w), G(p.v_b), a.v, a.norm1, P(p.v_w), false);
}

// The embedding's output gradient for its W: this rank's rows (1D over every tp rank, as the
// head), which W gathers under sequence parallelism (embedding_weights_input).
void Model::split_embedding_input(Slot& s) {
  copy(s.d_input, scratch_.grads.resid);
}

// The embedding's W reads every row: gathered under sequence parallelism (so wpe's is whole
// too) into the scratch's d_full.
Tensor Model::embedding_weights_input(const Slot& s) {
  if (!tp_->sequence_parallel()) return s.d_input;
  const Tensor full = scratch_.grads.full;
  tp_->g_backward(full, s.d_input);
  return full;
}

}  // namespace pentad
