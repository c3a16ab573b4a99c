#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace pentad {

namespace k = kernels;

static TensorParallelHooks one_device;  // degree 1: every hook a no-op
static ExpertParallelHooks all_experts_here;
static ContextParallelHooks whole_sequence;

void ContextParallelHooks::attention_forward(Tensor out, Tensor lse, const Tensor& q,
                                             const Tensor& k, const Tensor& v) {
  k::attention_forward(out, lse, q, k, v);
}

void ContextParallelHooks::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& out, const Tensor& lse) {
  k::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
}

Model::Model(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Sharding sharding,
             std::vector<LayerRange> layout, Placement placement)
    : Model(cfg, param_table(cfg), micro_batch, seq_len, sharding, std::move(layout), placement) {}

Model::Model(const ModelConfig& cfg, ParamTable table, int64_t micro_batch, int64_t seq_len,
             Sharding sharding, std::vector<LayerRange> layout, Placement placement)
    : cfg_(cfg),
      table_(std::move(table)),
      b_(micro_batch),
      t_(seq_len),
      placement_(placement),
      act_(placement.compute),
      tp_(sharding.tp ? sharding.tp : &one_device),
      ep_(sharding.ep ? sharding.ep : &all_experts_here),
      cp_(sharding.cp ? sharding.cp : &whole_sequence) {
  // seq_len is this rank's share of the sequence under context parallelism.
  PENTAD_CHECK(seq_len * cp_->degree() <= cfg.max_seq_len, "seq_len {} x cp {} > max_seq_len {}",
               seq_len, cp_->degree(), cfg.max_seq_len);
  const int64_t p = tp_->degree(), d1 = tp_->heads_degree(), d2 = tp_->hidden_degree();
  // Layouts that do not divide were refused with a user message (parallel::check_layout).
  PENTAD_CHECK(!cfg.is_moe() || p == 1 || tp_->sequence_parallel(),
               "MoE with tp {} needs sequence parallelism", p);
  PENTAD_CHECK(d1 * d2 == p && cfg.n_head % d1 == 0 && cfg.kv_heads() % d1 == 0 &&
                   ffn_dim(cfg) % d1 == 0 && cfg.d_model % d2 == 0 && cfg.vocab_size % p == 0 &&
                   (b_ * t_) % (tp_->sequence_parallel() ? p : 1) == 0,
               "tp degree {} ({}x{}) does not divide the model", p, d1, d2);
  if (layout.empty()) layout.push_back({0, cfg.n_layer, true, true});
  for (const LayerRange& c : layout) {
    PENTAD_CHECK(0 <= c.layer_begin && c.layer_begin < c.layer_end && c.layer_end <= cfg.n_layer &&
                     c.first == (c.layer_begin == 0) && c.last == (c.layer_end == cfg.n_layer),
                 "chunk [{}, {}) of {} layers", c.layer_begin, c.layer_end, cfg.n_layer);
    chunks_.push_back({c, {}});
  }
  heads_ = cfg.n_head / d1;
  kv_heads_ = cfg.kv_heads() / d1;
  att_width_ = heads_ * cfg.head_dim();
  kv_width_ = kv_heads_ * cfg.head_dim();
  ffn_ = ffn_dim(cfg) / d1;
  width_ = cfg.d_model / d2;
  apart_ = tp_->sequence_parallel() || d2 > 1;
  vocab_ = cfg.vocab_size / p;
  vocab_start_ = p > 1 ? tp_->rank() * vocab_ : -1;
  rows_ = tp_->local_rows(b_ * t_);
  sizes_ = activation_sizes(cfg, double(b_), double(t_), double(p), double(d2),
                            tp_->sequence_parallel(), act_);
  build_params();
  params_.allocate(placement_);
  Arena measure = Arena::measuring("activations");
  ArenaSink measuring(measure);
  plan_shared(measuring);
  shared_ = Arena("activations (shared)", measure.used(), placement_.device);
  ArenaSink sink(shared_);
  plan_shared(sink);
  declared_.bytes += sink.bytes, declared_.buffers += sink.buffers;
  for (int c = 0; c < chunks(); ++c) add_slot(c);  // one slot each, up front
}

// Views of (N, width) buffers as (b, t, heads, head_dim) for attention and RoPE.
static Tensor heads(const Tensor& x, int64_t b, int64_t t, int64_t d) {
  return x.reshaped(Shape{b, t, x.dim(1) / d, d});
}

void Model::layer_forward(int l, const Tensor& x, Tensor out, LayerActs& a, MoeBlock::Acts* moe,
                          float moe_weight, bool recomputing) {
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  const int64_t d = cfg_.head_dim();
  // Norm on this rank's rows; with SP, gathered into whole rows for the column-parallel q, k, v
  // (in 2D, their columns j).
  Tensor norm1 = apart_ ? scratch_.norm_local : a.norm1;
  if (gpt2())
    k::layernorm_forward(norm1, a.norm1_mean, a.norm1_rstd, x, P(p.norm1_w), P(p.norm1_b),
                         cfg_.norm_eps);
  else
    k::rmsnorm_forward(norm1, a.norm1_rstd, x, P(p.norm1_w), cfg_.norm_eps);
  tp_->gather_hidden(a.norm1, norm1);
  // 2D: partial sums over the d2 ranks, the bias added by one of them.
  const bool column_bias = tp_->hidden_rank() == 0;
  column_gemm(a.q, a.norm1, P(p.q_w), column_bias ? P(p.q_b) : Tensor{});
  column_gemm(a.k, a.norm1, P(p.k_w), column_bias ? P(p.k_b) : Tensor{});
  column_gemm(a.v, a.norm1, P(p.v_w), column_bias ? P(p.v_b) : Tensor{});
  tp_->end_hidden_sums();
  if (!gpt2()) {
    k::rope_forward(heads(a.q, b_, t_, d), 0, cfg_.rope_theta, cp_->positions());
    k::rope_forward(heads(a.k, b_, t_, d), 0, cfg_.rope_theta, cp_->positions());
  }
  cp_->attention_forward(heads(a.att, b_, t_, d), a.lse, heads(a.q, b_, t_, d),
                         heads(a.k, b_, t_, d), heads(a.v, b_, t_, d));
  // Row-parallel projection: partial sums, reduced over tp (2D: over d1, columns j). The
  // replicated bias is added by heads rank 0 only so that the sum holds it once.
  const bool add_bias = tp_->heads_rank() == 0;
  Tensor proj = apart_ ? scratch_.proj.prefix(Shape{b_ * t_, width_}) : out;
  k::linear_forward(proj, a.att, P(p.o_w), add_bias ? P(p.o_b) : Tensor{});
  tp_->reduce_hidden(out, proj);
  // res1 = x + attention, normalised in the same pass (one kernel on CUDA). An MoE layer in
  // 2D keeps its rows (the routed experts' input) apart.
  Tensor norm2 = !apart_ ? a.norm2 : a.norm2_rows.data ? a.norm2_rows : scratch_.norm_local;
  if (gpt2())
    k::residual_layernorm_forward(a.res1, norm2, a.norm2_mean, a.norm2_rstd, x, out, P(p.norm2_w),
                                  P(p.norm2_b), cfg_.norm_eps);
  else
    k::residual_rmsnorm_forward(a.res1, norm2, a.norm2_rstd, x, out, P(p.norm2_w), cfg_.norm_eps);
  tp_->gather_hidden(a.norm2, norm2);
  const int64_t ffn = layer_ffn_[size_t(l)];
  MoeBlock* block = moe_[size_t(l)].get();
  if (ffn > 0) mlp_forward(p, a, ffn, out);
  if (block) {  // the routed experts on this rank's rows, added to the shared experts' output
    PENTAD_CHECK(moe != nullptr, "layer {}: MoE activations missing", l);
    block->forward(*moe, moe_input(a), ffn > 0 ? scratch_.moe_out : out, moe_weight, !recomputing);
    if (ffn > 0) k::add(out, out, scratch_.moe_out);
  }
  k::add(out, out, a.res1);
}

// The MLP (or an MoE layer's shared experts) of width ffn on this rank: column-parallel up
// (and gate), row-parallel down, reduced over tp into out's rows.
void Model::mlp_forward(const LayerParams& p, LayerActs& a, int64_t ffn, Tensor out) {
  const bool add_bias = tp_->heads_rank() == 0;
  Tensor proj = apart_ ? scratch_.proj.prefix(Shape{b_ * t_, width_}) : out;
  const Tensor up = at_width(a.up, ffn), gate = at_width(a.gate, ffn), act = at_width(a.act, ffn);
  if (tp_->hidden_degree() > 1) {  // 2D: the d2 ranks' partial sums meet before the activation
    const Tensor up_bias = tp_->hidden_rank() == 0 ? P(p.up_b) : Tensor{};
    column_gemm(up, a.norm2, P(p.up_w), up_bias);
    if (!gpt2()) column_gemm(gate, a.norm2, P(p.gate_w), Tensor{});
    tp_->end_hidden_sums();
    if (gpt2())
      k::gelu_forward(act, up);
    else
      k::swiglu_forward(act, gate, up);
  } else if (gpt2()) {
    k::linear_gelu_forward(act, up, a.norm2, P(p.up_w), P(p.up_b));  // up = pre-GELU
  } else {
    k::linear_forward(gate, a.norm2, P(p.gate_w), Tensor{});
    k::linear_forward(up, a.norm2, P(p.up_w), Tensor{});
    k::swiglu_forward(act, gate, up);
  }
  k::linear_forward(proj, act, P(p.down_w), add_bias ? P(p.down_b) : Tensor{});
  tp_->reduce_hidden(out, proj);
}

// The row pieces a 2D layer's GEMMs run in (parallel.tp_chunks; one in 1D).
static std::vector<std::pair<int64_t, int64_t>> pieces(int64_t rows, int64_t chunks) {
  chunks = std::clamp<int64_t>(chunks, 1, std::max<int64_t>(rows, 1));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t c = 0; c < chunks; ++c)
    out.push_back({rows * c / chunks, rows * (c + 1) / chunks - rows * c / chunks});
  return out;
}

// out = inp @ w^T + bias, piece by piece, each piece's sum over the d2 ranks started as its
// GEMM ends (end_hidden_sums() finishes them).
void Model::column_gemm(Tensor out, const Tensor& inp, const Tensor& w, const Tensor& bias) {
  const int64_t chunks = tp_->hidden_degree() > 1 ? tp_->chunks() : 1;
  for (const auto& [first, rows] : pieces(out.dim(0), chunks)) {
    const Tensor part = chunks > 1 ? out.rows(first, rows) : out;
    k::linear_forward(part, chunks > 1 ? inp.rows(first, rows) : inp, w, bias);
    tp_->begin_hidden_sum(part);
  }
}

// A row-parallel GEMM's backward, its input gradient summed over the d2 ranks the same way.
// Either half may be absent (a split backward's B and W): the weight's gradient still adds
// up piece by piece, as the fused backward's does.
void Model::row_gemm_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& w, bool sum) {
  const int64_t chunks = tp_->hidden_degree() > 1 ? tp_->chunks() : 1;
  for (const auto& [first, rows] : pieces(dout.dim(0), chunks)) {
    const Tensor part = chunks > 1 && dinp.data ? dinp.rows(first, rows) : dinp;
    k::linear_backward(part, dweight, dbias, chunks > 1 ? dout.rows(first, rows) : dout,
                       chunks > 1 && inp.data ? inp.rows(first, rows) : inp, w, false);
    if (sum && dinp.data) tp_->begin_hidden_sum(part);
  }
}

// Buffers planned for the widest MLP (the backward scratch, and one layer's activations
// under recompute) seen at this layer's width; absent stays absent.
Tensor Model::at_width(const Tensor& t, int64_t ffn) const {
  return t.data ? t.prefix(Shape{b_ * t_, ffn}) : t;
}

Tensor Model::moe_input(const LayerActs& a) const {
  if (a.norm2_rows.data) return a.norm2_rows;  // 2D: kept apart (the gathered ones are columns)
  // Under sequence parallelism norm2 holds every rank's rows, gathered in rank order.
  return tp_->sequence_parallel() ? a.norm2.rows(tp_->rank() * rows_, rows_) : a.norm2;
}

float Model::forward(const int32_t* tokens, const int32_t* targets, float dloss) {
  PENTAD_CHECK(chunks() == 1 && chunk(0).first && chunk(0).last,
               "forward(): this rank holds part of the model; use forward_chunk");
  return forward_chunk(0, 0, tokens, targets, dloss);
}

void Model::backward(bool last_micro_batch, const GradsReady& on_ready) {
  backward_chunk(0, 0, Tensor{}, last_micro_batch, on_ready);
}

float Model::forward_chunk(int c, int slot_index, const int32_t* tokens, const int32_t* targets,
                           float dloss) {
  const LayerRange& range = chunk(c);
  Slot& s = slot(c, slot_index);
  PENTAD_CHECK(!s.weights_pending,
               "forward_chunk: chunk {} slot {} still waits for its W (backward_chunk_weights)", c,
               slot_index);
  const int64_t N = b_ * t_, V = cfg_.vocab_size;
  const bool sp = tp_->sequence_parallel();
  // The micro-batch's weight in the objective (its tokens on every cp rank).
  s.moe_weight = dloss * static_cast<float>(N * cp_->degree());
  auto copy_ids = [&](Tensor dst, const int32_t* src, const char* what) {
    PENTAD_CHECK(src != nullptr, "forward_chunk: chunk {} needs {}", c, what);
    for (int64_t i = 0; i < N; ++i)
      PENTAD_CHECK(src[i] >= 0 && src[i] < V, "{} id {} out of range at {}", what, src[i], i);
    if (dst.device == Device::CPU)
      copy_bytes(dst.data, dst.device, src, Device::CPU, dst.bytes());
    else
      uploads_.copy(dst.data, src, dst.bytes());
  };
  if (range.first) {
    copy_ids(s.tokens, tokens, "tokens");
    // Vocabulary-parallel embedding: each rank adds the rows it holds (positions on rank 0),
    // and the reduction over tp leaves whole embeddings in this rank's residual rows.
    Tensor emb = sp ? scratch_.proj : s.resid[0];
    param_hooks_->need(embed_ids_, false);
    k::embedding_forward(emb.reshaped(Shape{b_, t_, cfg_.d_model}), s.tokens, P(wte_),
                         tp_->rank() == 0 ? P(wpe_) : Tensor{}, vocab_start_, cp_->positions());
    param_hooks_->done(embed_ids_);
    tp_->g_forward(s.resid[0], emb);
  }
  for (int64_t l = range.layer_begin; l < range.layer_end; ++l) {
    const size_t i = static_cast<size_t>(l - range.layer_begin);
    param_hooks_->need(layer_ids_[size_t(l)], false);
    layer_forward(static_cast<int>(l), s.resid[i], s.resid[i + 1],
                  cfg_.recompute ? scratch_.layer : s.acts[i], s.moe.empty() ? nullptr : &s.moe[i],
                  s.moe_weight);
    param_hooks_->done(layer_ids_[size_t(l)]);
    if (progress_) progress_();
  }
  if (!range.last) return 0.0f;
  copy_ids(s.targets, targets, "targets");
  param_hooks_->need(final_ids_, false);
  const Tensor& last = s.resid.back();
  const ScratchActs& h = scratch_;
  if (gpt2())
    k::layernorm_forward(h.normf_local, h.normf_mean, h.normf_rstd, last, P(normf_w_), P(normf_b_),
                         cfg_.norm_eps);
  else
    k::rmsnorm_forward(h.normf_local, h.normf_rstd, last, P(normf_w_), cfg_.norm_eps);
  tp_->f_forward(h.normf, h.normf_local);
  k::linear_forward(h.logits, h.normf, P(head_), Tensor{});
  const Tensor dlogits = dloss != 0.0f ? h.logits : Tensor{};
  if (tp_->degree() == 1) {
    k::crossentropy_forward_backward(h.losses, dlogits, h.logits, s.targets, dloss);
  } else {
    k::vocab_parallel_ce_max(scratch_.row_max, h.logits);
    tp_->max(scratch_.row_max);
    k::vocab_parallel_ce_stats(scratch_.ce_stats, h.logits, scratch_.row_max, s.targets,
                               vocab_start_);
    tp_->sum(scratch_.ce_stats);
    k::vocab_parallel_ce_finish(h.losses, dlogits, h.logits, scratch_.row_max, scratch_.ce_stats,
                                s.targets, vocab_start_, dloss);
  }
  if (dloss != 0.0f) {
    param_hooks_->need(final_ids_, true);  // ZeRO-3: as a backward's, prefetching the layers
    head_backward(c, s);
    param_hooks_->done(final_ids_);
  }
  param_hooks_->done(final_ids_);
  if (loss_total_.data) {
    k::sum_into(loss_total_, h.losses, 1.0 / static_cast<double>(N));
    return 0.0f;
  }
  const float* losses = h.losses.f32();
  if (h.losses.device != Device::CPU) {
    host_losses_.resize(static_cast<size_t>(N));
    copy_bytes(host_losses_.data(), Device::CPU, losses, h.losses.device, h.losses.bytes());
    uploads_.rewind();  // the readback waited for every upload queued before it
    losses = host_losses_.data();
  }
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += losses[i];
  return static_cast<float>(sum / static_cast<double>(N));
}

// The head's and the final norm's whole backward, at the end of the last chunk's forward,
// where the loss has just written d(logits) over the logits: the head's weight gradient
// (+=), the final norm's (under set_reduce_each_pass into the slot's buffers, which its next
// pass finishing gradients joins) and d(chunk output), written over the chunk's output,
// which the final norm has read for the last time. So no slot keeps the logits or the final
// norm's output: the scratch holds one micro-batch's. The same calls as the backward ran
// them, so every gradient is the same; a parameter's micro-batches still add in their order.
void Model::head_backward(int c, Slot& s) {
  LayerGrads& g = scratch_.grads;
  const ScratchActs& h = scratch_;
  const NormGradsScope norms(*this, c, s);
  k::zero(g.resid);  // the norm backward below accumulates into it
  k::linear_backward(g.norm, head_grad(), Tensor{}, h.logits, h.normf, P(head_), false);
  // The head is 1D over every tp rank (2D too): its rows apart only with SP.
  const Tensor norm_local = tp_->sequence_parallel() ? g.norm_local : g.norm;
  tp_->f_backward(norm_local, g.norm);
  const Tensor& last = s.resid.back();
  if (gpt2())
    k::layernorm_backward(g.resid, GB(normf_w_), GB(normf_b_), norm_local, last, P(normf_w_),
                          h.normf_mean, h.normf_rstd);
  else
    k::rmsnorm_backward(g.resid, GB(normf_w_), norm_local, last, P(normf_w_), h.normf_rstd);
  copy(last, g.resid);
  s.head_done = true;
}

// The last chunk's backward starts from d(chunk output), which its forward left over the
// chunk's output (head_backward).
void Model::take_chunk_output_grad(int c, int slot_index, Slot& s) {
  PENTAD_CHECK(s.head_done, "backward needs a forward with dloss != 0 (chunk {} slot {})", c,
               slot_index);
  copy(scratch_.grads.resid, s.resid.back());
  s.head_done = false;
}

void Model::mlp_backward(const LayerParams& p, LayerActs& a, int64_t ffn) {
  LayerGrads& g = scratch_.grads;
  const Tensor a_up = at_width(a.up, ffn), a_gate = at_width(a.gate, ffn),
               a_act = at_width(a.act, ffn);
  Tensor up = at_width(g.up, ffn), act = at_width(g.act, ffn);
  const Tensor full = g.full.prefix(Shape{b_ * t_, width_}), norm = g.norm.prefix(full.shape);
  tp_->gather_hidden(full, g.resid);
  if (tp_->hidden_degree() > 1) {  // 2D: the activation's gradient summed over the d2 ranks
    row_gemm_backward(act, G(p.down_w), G(p.down_b), full, a_act, P(p.down_w));
    tp_->end_hidden_sums();
    if (gpt2()) {
      k::gelu_backward(up, act, a_up);
      k::linear_backward(norm, G(p.up_w), G(p.up_b), up, a.norm2, P(p.up_w), false);
    } else {
      Tensor gate = at_width(g.gate, ffn);
      k::swiglu_backward(gate, up, act, a_gate, a_up);
      k::linear_backward(norm, G(p.gate_w), Tensor{}, gate, a.norm2, P(p.gate_w), false);
      k::linear_backward(norm, G(p.up_w), Tensor{}, up, a.norm2, P(p.up_w), true);
    }
    tp_->reduce_hidden(g.norm_local, norm);
    return;
  }
  if (gpt2()) {  // d(pre-GELU) straight from the projection's backward
    k::linear_backward_gelu(up, G(p.down_w), G(p.down_b), g.full, a_act, P(p.down_w), a_up);
    k::linear_backward(g.norm, G(p.up_w), G(p.up_b), up, a.norm2, P(p.up_w), false);
  } else {
    Tensor gate = at_width(g.gate, ffn);
    k::linear_backward(act, G(p.down_w), Tensor{}, g.full, a_act, P(p.down_w), false);
    k::swiglu_backward(gate, up, act, a_gate, a_up);
    k::linear_backward(g.norm, G(p.gate_w), Tensor{}, gate, a.norm2, P(p.gate_w), false);
    k::linear_backward(g.norm, G(p.up_w), Tensor{}, up, a.norm2, P(p.up_w), true);
  }
  tp_->reduce_hidden(g.norm_local, g.norm);
}

void Model::layer_backward(int l, const Tensor& x, LayerActs& a, MoeBlock::Acts* moe,
                           float moe_weight, const std::function<void()>& poll) {
  auto progress = [&] {
    if (poll) poll();
  };
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  const int64_t d = cfg_.head_dim();
  LayerGrads& g = scratch_.grads;
  // MLP block: g.resid holds d(out) and, through the residual, d(res1) so far.
  const int64_t ffn = layer_ffn_[size_t(l)];
  if (ffn > 0)
    mlp_backward(p, a, ffn);  // d(norm2 output) into g.norm_local
  else
    k::zero(g.norm_local);  // the routed experts' backward adds into it
  if (MoeBlock* block = moe_[size_t(l)].get()) {
    PENTAD_CHECK(moe != nullptr, "layer {}: MoE activations missing", l);
    block->backward(*moe, moe_input(a), g.resid, g.norm_local, moe_weight);
  }
  if (gpt2())
    k::layernorm_backward(g.resid, G(p.norm2_w), G(p.norm2_b), g.norm_local, a.res1, P(p.norm2_w),
                          a.norm2_mean, a.norm2_rstd);
  else
    k::rmsnorm_backward(g.resid, G(p.norm2_w), g.norm_local, a.res1, P(p.norm2_w), a.norm2_rstd);
  progress();
  // Attention block: g.resid now holds d(res1).
  const Tensor full = g.full.prefix(Shape{b_ * t_, width_}), norm = g.norm.prefix(full.shape);
  tp_->gather_hidden(full, g.resid);
  // Planted for the layout test: the heads' gradient left partial over the d2 ranks.
  row_gemm_backward(g.att, G(p.o_w), G(p.o_b), full, a.att, P(p.o_w),
                    !bug_injected("tp2d-skip-hidden-grad-sum"));
  tp_->end_hidden_sums();
  progress();
  cp_->attention_backward(heads(g.q, b_, t_, d), heads(g.k, b_, t_, d), heads(g.v, b_, t_, d),
                          heads(g.att, b_, t_, d), heads(a.q, b_, t_, d), heads(a.k, b_, t_, d),
                          heads(a.v, b_, t_, d), heads(a.att, b_, t_, d), a.lse);
  if (!gpt2()) {
    k::rope_backward(heads(g.q, b_, t_, d), 0, cfg_.rope_theta, cp_->positions());
    k::rope_backward(heads(g.k, b_, t_, d), 0, cfg_.rope_theta, cp_->positions());
  }
  progress();
  k::linear_backward(norm, G(p.q_w), G(p.q_b), g.q, a.norm1, P(p.q_w), false);
  k::linear_backward(norm, G(p.k_w), G(p.k_b), g.k, a.norm1, P(p.k_w), true);
  k::linear_backward(norm, G(p.v_w), G(p.v_b), g.v, a.norm1, P(p.v_w), true);
  tp_->reduce_hidden(g.norm_local, norm);
  if (gpt2())
    k::layernorm_backward(g.resid, G(p.norm1_w), G(p.norm1_b), g.norm_local, x, P(p.norm1_w),
                          a.norm1_mean, a.norm1_rstd);
  else
    k::rmsnorm_backward(g.resid, G(p.norm1_w), g.norm_local, x, P(p.norm1_w), a.norm1_rstd);
}

void Model::sync_partial_grads(const std::vector<int>& ids) {
  if (!tp_->sequence_parallel() || bug_injected("sp-skip-norm-grads")) return;
  for (int id : ids) tp_->sum(G(id));
}

void Model::backward_chunk(int c, int slot_index, const Tensor& d_output, bool last_micro_batch,
                           const GradsReady& on_ready) {
  const LayerRange& range = chunk(c);
  Slot& s = slot(c, slot_index);
  LayerGrads& g = scratch_.grads;
  int64_t reported = -1;  // the offset last given to on_ready
  auto ready = [&](int first_param, const std::vector<int>& partial) {
    if (!last_micro_batch && !reduce_each_pass_) return;
    sync_partial_grads(partial);
    reported = static_cast<int64_t>(params_.spec(first_param).offset);
    if (on_ready) on_ready(reported);
  };
  const std::function<void()> poll = [&] {
    if (reported >= 0 && on_ready) on_ready(reported);
  };
  if (range.last) {
    take_chunk_output_grad(c, slot_index, s);
    join_norm_grads(s, {normf_w_, normf_b_});
    ready(normf_w_, partial_.back());
  } else {
    PENTAD_CHECK(d_output.numel() == g.resid.numel(), "chunk {}: d_output has {} values, want {}",
                 c, d_output.numel(), g.resid.numel());
    copy(g.resid, d_output);
  }
  for (int64_t l = range.layer_end - 1; l >= range.layer_begin; --l) {
    const size_t i = static_cast<size_t>(l - range.layer_begin);
    const Tensor& x = s.resid[i];
    LayerActs& a = cfg_.recompute ? scratch_.layer : s.acts[i];
    MoeBlock::Acts* moe = s.moe.empty() ? nullptr : &s.moe[i];
    param_hooks_->need(layer_ids_[size_t(l)], true);
    if (cfg_.recompute)
      layer_forward(static_cast<int>(l), x, s.resid[i + 1], a, moe, s.moe_weight, true);
    layer_backward(static_cast<int>(l), x, a, moe, s.moe_weight, poll);
    param_hooks_->done(layer_ids_[size_t(l)]);
    ready(layers_[static_cast<size_t>(l)].norm1_w, partial_[static_cast<size_t>(l)]);
    if (progress_) progress_();
  }
  if (!range.first) return;
  // The embedding's gradient needs every row: gathered under SP (so wpe's is whole too).
  const Tensor full = tp_->sequence_parallel() ? g.full : g.resid;  // 1D over every tp rank
  tp_->g_backward(full, g.resid);
  k::embedding_backward(G(wte_), G(wpe_), full.reshaped(Shape{b_, t_, cfg_.d_model}), s.tokens,
                        vocab_start_, cp_->positions());
  ready(wte_, {});
}

}  // namespace pentad
