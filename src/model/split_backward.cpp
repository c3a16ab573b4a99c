// The backward in two passes (model/model.h), for zero-bubble pipelines (Qi et al., arXiv
// 2401.10241): B, the input gradients down the chunk, and W, the parameter gradients, later.
// Each GEMM's backward is linear_backward once with dinp (in B) and once with dweight and
// dbias (in W); the kernels compute those parts apart from each other, so every gradient is
// bitwise backward_chunk's, which stays the fused default. The norms' backward stays whole
// in B: the same call as backward_chunk's, d(input) and d(weight, bias) together, so W needs
// none of their output gradients. (Under sequence parallelism their partial gradients are
// summed over tp at the last micro-batch's W, after every B has added to them.)
//
// What W reads and where it is kept:
//   the GEMMs' inputs: the slot's LayerActs (norm1, att, norm2, act),
//     kept for backward anyway and reused until W; under model.recompute (no LayerActs in
//     the slot) B rebuilds the layer's activations as backward_chunk does, those of them W
//     reads (q, k, v, up, gate too, below) into the slot's DeferredGrads::inputs, the rest
//     in the scratch;
//   the column-parallel GEMMs' output gradients d(q), d(k), d(v) (after RoPE's backward),
//     d(up) (GPT-2: pre-GELU) and d(gate), in place of the slot's LayerActs q, k, v, up, gate,
//     which only B reads (attention's backward, GELU's or SwiGLU's) and the slot's next
//     forward rewrites. The activation's backward writes d(up), d(gate) over up, gate
//     elementwise, as it reads them. Attention's backward reads q, k, v whole while it writes
//     their gradients, so it writes them into the scratch's buffers, and the layer's q, k, v
//     buffers and the scratch's trade places (keep_attention_grads): the next layer's B
//     writes into this layer's old q, k, v, and so on down the chunk. At the chunk's end the
//     scratch takes its own buffers back, which its last layer (B's first) holds, with one
//     copy a chunk (return_attention_scratch) where a copy a layer would be needed otherwise;
//   the row-parallel GEMMs' output gradients d(att_out) and d(out), and the first chunk's
//     d(chunk input) for the embedding: the scratch's d(residual), which B overwrites layer
//     by layer, so kept in the slot: whole rows (per layer 2 Cj values a row, C without
//     tensor parallelism), or under sequence parallelism this rank's rows, which W gathers
//     again (split_backward_tp.cpp). They go over slot activations that B reads for the last
//     time before it writes them, and W never reads: d(out) of layer l over the layer's output (the
//     next layer's input, read last by that layer's B, which runs first; on the last chunk the
//     chunk's output, which already holds it: the forward's head backward wrote it there),
//     d(att_out) over its res1 (read last by its norm2 backward, just before), d(chunk input) over
//     the embedding's output (layer 0's input, read last by its norm1 backward). Nothing else
//     writes them before the slot's W: a pipeline sends and receives through buffers of its own,
//     and the slot's next forward waits for W. So for dense layers the split then holds no more
//     than the fused backward. Under recompute res1 is the scratch's, so d(att_out) is kept apart,
//     in an arena allocated on the slot's first B and held from then on (the layer's output is
//     rebuilt by its own B, before d(out) goes over it);
// The head's and the final norm's gradients are the last chunk's forward's (head_backward):
// B starts from the d(chunk output) it left over the chunk's output, W joins the norm's.
// An MoE layer's router and routed experts keep theirs in the slot's MoeBlock::Acts, sized
// at each B (model/split_backward_moe.cpp).
#include <utility>

#include "kernels/ops.h"
#include "model/model.h"

namespace pentad {

namespace k = kernels;

void Model::plan_deferred(ActSink& sink, const LayerRange& chunk, Slot& s) {
  s.deferred.assign(size_t(chunk.layer_end - chunk.layer_begin), {});
  for (size_t i = 0; i < s.deferred.size(); ++i)
    declare_deferred_layer(sizes_, double(layer_ffn_[size_t(chunk.layer_begin) + i]),
                           moe_[size_t(chunk.layer_begin) + i] != nullptr,
                           s.acts.empty() ? Tensor{} : s.acts[i].res1, s.resid[i + 1], sink,
                           s.deferred[i]);
  declare_deferred_ends(sizes_, chunk.first, s.resid[0], sink, s.d_input);
}

size_t Model::deferred_bytes() const {
  size_t bytes = 0;
  for (const ChunkState& c : chunks_)
    for (const auto& s : c.slots) {
      bytes += s->deferred_arena.capacity() + s->norm_arena.capacity();
      for (const MoeBlock::Acts& m : s->moe) bytes += m.deferred.capacity();
    }
  return bytes;
}

// Under recompute, the activations layer l's B rebuilds: the scratch's, but for W's operands,
// the slot's DeferredGrads::inputs (activations.h).
LayerActs Model::rebuilt_acts(const DeferredGrads& d) const {
  LayerActs a = scratch_.layer;
  const LayerActs& w = d.inputs;
  a.norm1 = w.norm1, a.q = w.q, a.k = w.k, a.v = w.v, a.att = w.att, a.norm2 = w.norm2;
  a.norm2_rows = w.norm2_rows, a.up = w.up, a.gate = w.gate, a.act = w.act;
  return a;
}

// Layer l's B: layer_backward's input gradients and norm gradients (dense), the output
// gradients W reads into d and over a's q, k, v, up, gate. g.resid: d(layer output) in,
// d(layer input) out. The blocks' tensor- and context-parallel halves are
// model/split_backward_tp.cpp's.
void Model::layer_backward_input(int l, const Tensor& x, LayerActs& a, const DeferredGrads& d,
                                 MoeBlock::Acts* moe, float moe_weight) {
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  LayerGrads& g = scratch_.grads;
  // d(norm2 output) into g.norm_local: the MLP's (an MoE layer's shared experts'), the routed's.
  if (layer_ffn_[size_t(l)] > 0) split_mlp_input(p, a, layer_ffn_[size_t(l)], d);
  if (moe_[size_t(l)]) split_moe_input(l, a, moe, moe_weight);
  if (gpt2())
    k::layernorm_backward(g.resid, GB(p.norm2_w), GB(p.norm2_b), g.norm_local, a.res1, P(p.norm2_w),
                          a.norm2_mean, a.norm2_rstd);
  else
    k::rmsnorm_backward(g.resid, GB(p.norm2_w), g.norm_local, a.res1, P(p.norm2_w), a.norm2_rstd);
  split_attention_input(p, a, d);  // from d(res1) in g.resid: d(norm1 output) into g.norm_local
  if (gpt2())
    k::layernorm_backward(g.resid, GB(p.norm1_w), GB(p.norm1_b), g.norm_local, x, P(p.norm1_w),
                          a.norm1_mean, a.norm1_rstd);
  else
    k::rmsnorm_backward(g.resid, GB(p.norm1_w), g.norm_local, x, P(p.norm1_w), a.norm1_rstd);
}

// Layer l's W: layer_backward's GEMMs' parameter gradients (+=), from their inputs in a and
// their output gradients in d and a (B's). Reads no scratch.
void Model::layer_backward_weights(int l, const LayerActs& a, const DeferredGrads& d,
                                   MoeBlock::Acts* moe, const std::function<void()>& poll) {
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  if (layer_ffn_[size_t(l)] > 0) split_mlp_weights(p, a, layer_ffn_[size_t(l)], d);
  if (moe_[size_t(l)]) split_moe_weights(l, a, moe);
  if (poll) poll();
  split_attention_weights(p, a, d);
  if (poll) poll();
}

void Model::backward_chunk_input(int c, int slot_index, const Tensor& d_output) {
  const LayerRange& range = chunk(c);
  Slot& s = slot(c, slot_index);
  PENTAD_CHECK(!s.weights_pending, "backward_chunk_input: chunk {} slot {} waits for its W", c,
               slot_index);
  if (s.deferred.empty()) {  // the slot's first B: its buffers, measured then made (maybe none)
    Arena measure = Arena::measuring("deferred gradients");
    ArenaSink measuring(measure);
    plan_deferred(measuring, range, s);
    s.deferred_arena = Arena(fmt::format("deferred gradients (chunk {} slot {})", c, slot_index),
                             measure.used(), placement_.device);
    ArenaSink sink(s.deferred_arena);
    plan_deferred(sink, range, s);
    declared_.bytes += sink.bytes, declared_.buffers += sink.buffers;
  }
  LayerGrads& g = scratch_.grads;
  // Under set_reduce_each_pass the norms' gradients go to the slot's buffers until its W.
  const NormGradsScope norms(*this, c, s);
  if (range.last) {
    take_chunk_output_grad(c, slot_index, s);
  } else {
    PENTAD_CHECK(d_output.numel() == g.resid.numel(), "chunk {}: d_output has {} values, want {}",
                 c, d_output.numel(), g.resid.numel());
    copy(g.resid, d_output);
  }
  for (int64_t l = range.layer_end - 1; l >= range.layer_begin; --l) {
    const size_t i = static_cast<size_t>(l - range.layer_begin);
    MoeBlock::Acts* moe = s.moe.empty() ? nullptr : &s.moe[i];
    param_hooks_->need(layer_ids_[size_t(l)], true);
    if (!cfg_.recompute) {
      layer_backward_input(static_cast<int>(l), s.resid[i], s.acts[i], s.deferred[i], moe,
                           s.moe_weight);
    } else {  // as backward_chunk's recompute, W's operands into the slot
      LayerActs a = rebuilt_acts(s.deferred[i]);
      layer_forward(static_cast<int>(l), s.resid[i], s.resid[i + 1], a, moe, s.moe_weight, true);
      layer_backward_input(static_cast<int>(l), s.resid[i], a, s.deferred[i], moe, s.moe_weight);
    }
    keep_attention_grads(cfg_.recompute ? s.deferred[i].inputs : s.acts[i]);
    param_hooks_->done(layer_ids_[size_t(l)]);
    if (progress_) progress_();
  }
  if (range.layer_end > range.layer_begin) {
    const size_t top = size_t(range.layer_end - range.layer_begin - 1);
    return_attention_scratch(cfg_.recompute ? s.deferred[top].inputs : s.acts[top]);
  }
  if (range.first) split_embedding_input(s);  // the embedding's output gradient, for W
  s.weights_pending = true;
}

// Layer B just wrote d(q), d(k), d(v) into the scratch's g.q, g.k, g.v, and read its own q,
// k, v for the last time: the two trade buffers (same shapes), so W finds the gradients
// where it reads them (kept's q, k, v) and the next layer's B writes over the dead values.
void Model::keep_attention_grads(LayerActs& kept) {
  LayerGrads& g = scratch_.grads;
  for (auto [a, d] : {std::pair{&kept.q, &g.q}, {&kept.k, &g.k}, {&kept.v, &g.v}}) {
    PENTAD_CHECK(a->bytes() == d->bytes(), "split backward: {} bytes of q, k or v, {} in scratch",
                 a->bytes(), d->bytes());
    std::swap(a->data, d->data);
  }
}

// At a chunk's end the scratch holds the chunk's first layer's old q, k, v buffers, and its
// own are top's (the chunk's last layer, whose B ran first): top's gradients move into the
// buffers the scratch holds, and the scratch takes its own back. The scratch is whole again
// for whatever pass comes next (the head's buffers lie over it).
void Model::return_attention_scratch(LayerActs& top) {
  LayerGrads& g = scratch_.grads;
  for (auto [a, d] : {std::pair{&top.q, &g.q}, {&top.k, &g.k}, {&top.v, &g.v}}) {
    copy(*d, *a);
    std::swap(a->data, d->data);
  }
}

void Model::norm_grads_of(int c, Slot& s) {
  if (s.norm_grads.empty()) {
    const LayerRange& range = chunk(c);
    std::vector<int> ids;
    if (range.last) ids = {normf_w_, normf_b_};
    for (int64_t l = range.layer_begin; l < range.layer_end; ++l) {
      const LayerParams& p = layers_[size_t(l)];
      ids.insert(ids.end(), {p.norm1_w, p.norm1_b, p.norm2_w, p.norm2_b});
    }
    std::erase(ids, -1);
    size_t bytes = 0;
    for (int id : ids) bytes += size_t(params_.spec(id).local_shape.numel()) * sizeof(float) + 256;
    s.norm_arena = Arena("norm gradients from B to W", bytes, placement_.device);
    s.norm_grads.assign(params_.specs().size(), Tensor{});
    for (int id : ids) {
      s.norm_grads[size_t(id)] = s.norm_arena.alloc(params_.spec(id).local_shape, DType::F32);
      k::zero(s.norm_grads[size_t(id)]);
    }
  }
  norm_grads_ = &s.norm_grads;
}

void Model::join_norm_grads(Slot& s, std::initializer_list<int> ids) {
  if (s.norm_grads.empty()) return;
  for (int id : ids)
    if (id >= 0) {
      const Tensor mine = s.norm_grads[size_t(id)];
      k::add(G(id), G(id), mine);
      k::zero(mine);
    }
}

void Model::backward_chunk_weights(int c, int slot_index, bool last_micro_batch,
                                   const GradsReady& on_ready) {
  const LayerRange& range = chunk(c);
  Slot& s = slot(c, slot_index);
  PENTAD_CHECK(s.weights_pending,
               "backward_chunk_weights: chunk {} slot {} has no B to follow "
               "(backward_chunk_input first)",
               c, slot_index);
  // Reported as backward_chunk reports them: the same offsets, in the same order.
  int64_t reported = -1;
  auto ready = [&](int first_param, const std::vector<int>& partial) {
    if (!last_micro_batch && !reduce_each_pass_) return;
    sync_partial_grads(partial);
    reported = static_cast<int64_t>(params_.spec(first_param).offset);
    if (on_ready) on_ready(reported);
  };
  const std::function<void()> poll = [&] {
    if (reported >= 0 && on_ready) on_ready(reported);
  };
  if (range.last) {  // the head's gradient is its forward's (head_backward)
    join_norm_grads(s, {normf_w_, normf_b_});
    ready(normf_w_, partial_.back());  // the final norm's gradients: the forward's
  }
  for (int64_t l = range.layer_end - 1; l >= range.layer_begin; --l) {
    const size_t i = static_cast<size_t>(l - range.layer_begin);
    param_hooks_->need(layer_ids_[size_t(l)], true);
    layer_backward_weights(static_cast<int>(l), cfg_.recompute ? s.deferred[i].inputs : s.acts[i],
                           s.deferred[i], s.moe.empty() ? nullptr : &s.moe[i], poll);
    param_hooks_->done(layer_ids_[size_t(l)]);
    const LayerParams& p = layers_[static_cast<size_t>(l)];
    join_norm_grads(s, {p.norm1_w, p.norm1_b, p.norm2_w, p.norm2_b});
    ready(p.norm1_w, partial_[static_cast<size_t>(l)]);
    if (progress_) progress_();
  }
  s.weights_pending = false;
  if (!range.first) return;
  k::embedding_backward(G(wte_), G(wpe_),
                        embedding_weights_input(s).reshaped(Shape{b_, t_, cfg_.d_model}), s.tokens,
                        vocab_start_, cp_->positions());
  const bool tied_apart = tied_head_apart();
  tied_embeddings_ += tied_apart ? 1 : 0;
  if (tied_apart && last_micro_batch) {
    PENTAD_CHECK(tied_heads_ == tied_embeddings_,
                 "tied embedding: {} head Ws but {} embedding Ws when the step's last ran",
                 tied_heads_, tied_embeddings_);
    k::add(G(wte_), G(wte_), tied_head_grad_);
    k::zero(tied_head_grad_);
    tied_heads_ = tied_embeddings_ = 0;
  }
  ready(wte_, {});
}

bool Model::tied_head_apart() const {
  return tied_head_apart_ && wte_ >= 0 && head_ == wte_ && !(chunk(0).first && chunk(0).last);
}

// Where the head's weight gradient adds: the head's own, or with the tied embedding's two
// uses in two chunks of this rank, set_tied_head_apart's buffer (made on first use).
Tensor Model::head_grad() {
  if (!tied_head_apart()) return G(head_);
  if (tied_head_grad_.data == nullptr) {
    const Tensor wte = G(wte_);
    tied_head_arena_ = Arena("tied head gradient",
                             size_t(wte.numel()) * dtype_bytes(wte.dtype) + 256, placement_.device);
    tied_head_grad_ = tied_head_arena_.alloc(wte.shape, wte.dtype);
    k::zero(tied_head_grad_);
  }
  ++tied_heads_;
  return tied_head_grad_;
}

}  // namespace pentad
