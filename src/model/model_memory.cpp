// The model's activation memory (model/model.h): what one layer, one slot of a chunk and
// the scratch shared by every pass hold, planned twice (measured, then allocated) for a
// fixed micro-batch; the slots a pipeline adds; and the views it reads through.
#include <algorithm>

#include "model/model.h"

namespace pentad {

void Model::plan_layer(Arena& arena, LayerActs& a, int64_t F, bool moe) {
  const int64_t N = b_ * t_, Nl = rows_, C = cfg_.d_model, Cj = width_;
  a.norm1 = arena.alloc(Shape{N, Cj}, act_);
  if (gpt2()) a.norm1_mean = arena.alloc(Shape{Nl});
  a.norm1_rstd = arena.alloc(Shape{Nl});
  a.q = arena.alloc(Shape{N, att_width_}, act_);
  a.k = arena.alloc(Shape{N, kv_width_}, act_);
  a.v = arena.alloc(Shape{N, kv_width_}, act_);
  a.att = arena.alloc(Shape{N, att_width_}, act_);
  a.lse = arena.alloc(Shape{b_, heads_, t_});
  a.res1 = arena.alloc(Shape{Nl, C}, act_);
  a.norm2 = arena.alloc(Shape{N, Cj}, act_);
  if (moe && tp_->hidden_degree() > 1) a.norm2_rows = arena.alloc(Shape{Nl, C}, act_);
  if (gpt2()) a.norm2_mean = arena.alloc(Shape{Nl});
  a.norm2_rstd = arena.alloc(Shape{Nl});
  if (F == 0) return;  // an MoE layer without shared experts
  a.up = arena.alloc(Shape{N, F}, act_);
  if (!gpt2()) a.gate = arena.alloc(Shape{N, F}, act_);
  a.act = arena.alloc(Shape{N, F}, act_);
}

void Model::plan_slot(Arena& arena, const LayerRange& chunk, Slot& s) {
  const int64_t N = b_ * t_, Nl = rows_, C = cfg_.d_model;
  const bool sp = tp_->sequence_parallel();
  s.tokens = arena.alloc(Shape{b_, t_}, DType::I32);
  s.targets = arena.alloc(Shape{b_, t_}, DType::I32);
  s.resid.clear();
  for (int64_t l = chunk.layer_begin; l <= chunk.layer_end; ++l)
    s.resid.push_back(arena.alloc(Shape{Nl, C}, act_));
  s.acts.assign(cfg_.recompute ? 0 : static_cast<size_t>(chunk.layer_end - chunk.layer_begin), {});
  for (size_t i = 0; i < s.acts.size(); ++i)
    plan_layer(arena, s.acts[i], layer_ffn_[size_t(chunk.layer_begin) + i],
               moe_[size_t(chunk.layer_begin) + i] != nullptr);
  if (!chunk.last) return;
  s.normf = arena.alloc(Shape{N, C}, act_);
  s.normf_local = sp ? arena.alloc(Shape{Nl, C}, act_) : s.normf;
  if (gpt2()) s.normf_mean = arena.alloc(Shape{Nl});
  s.normf_rstd = arena.alloc(Shape{Nl});
  s.logits = arena.alloc(Shape{N, vocab_}, act_);
  s.losses = arena.alloc(Shape{N});
}

void Model::plan_shared(Arena& arena) {
  const int64_t N = b_ * t_, Nl = rows_, C = cfg_.d_model;
  const int64_t F = *std::max_element(layer_ffn_.begin(), layer_ffn_.end());
  if (cfg_.recompute) plan_layer(arena, shared_acts_, F, false);  // (MoE does not recompute)
  if (cfg_.is_moe()) moe_out_ = arena.alloc(Shape{Nl, C}, act_);
  if (apart_) norm_local_ = arena.alloc(Shape{Nl, C}, act_);
  proj_ = arena.alloc(Shape{N, C}, act_);
  if (tp_->degree() > 1 && holds_last()) {
    row_max_ = arena.alloc(Shape{N});
    ce_stats_ = arena.alloc(Shape{2, N});
  }
  grads_.resid = arena.alloc(Shape{Nl, C}, act_);
  grads_.full = apart_ ? arena.alloc(Shape{N, C}, act_) : grads_.resid;
  grads_.norm = arena.alloc(Shape{N, C}, act_);
  grads_.norm_local = apart_ ? arena.alloc(Shape{Nl, C}, act_) : grads_.norm;
  grads_.att = arena.alloc(Shape{N, att_width_}, act_);
  grads_.q = arena.alloc(Shape{N, att_width_}, act_);
  grads_.k = arena.alloc(Shape{N, kv_width_}, act_);
  grads_.v = arena.alloc(Shape{N, kv_width_}, act_);
  if (F == 0) return;
  grads_.up = arena.alloc(Shape{N, F}, act_);
  if (!gpt2()) grads_.gate = arena.alloc(Shape{N, F}, act_);
  grads_.act = arena.alloc(Shape{N, F}, act_);
}

int Model::add_slot(int c) {
  ChunkState& chunk = chunks_.at(static_cast<size_t>(c));
  auto s = std::make_unique<Slot>();
  Arena measure = Arena::measuring("activations");
  plan_slot(measure, chunk.range, *s);
  s->arena = Arena(fmt::format("activations (chunk {} slot {})", c, chunk.slots.size()),
                   measure.used(), placement_.device);
  plan_slot(s->arena, chunk.range, *s);
  if (cfg_.is_moe()) s->moe.resize(size_t(chunk.range.layer_end - chunk.range.layer_begin));
  chunk.slots.push_back(std::move(s));
  return static_cast<int>(chunk.slots.size()) - 1;
}

Model::Slot& Model::slot(int c, int s) const {
  const ChunkState& chunk = chunks_.at(static_cast<size_t>(c));
  return *chunk.slots.at(static_cast<size_t>(s));
}

Tensor Model::chunk_input(int c, int s) const {
  return slot(c, s).resid.front();
}
Tensor Model::chunk_output(int c, int s) const {
  return slot(c, s).resid.back();
}
int Model::slots_made(int c) const {
  return static_cast<int>(chunks_.at(size_t(c)).slots.size());
}
size_t Model::slot_bytes(int c) const {
  return slot(c, 0).arena.capacity();
}

size_t Model::activation_bytes() const {
  size_t bytes = shared_.capacity();
  for (const ChunkState& c : chunks_)
    for (const auto& s : c.slots) bytes += s->arena.capacity();
  return bytes;
}

Tensor Model::logits() const {
  PENTAD_CHECK(chunks() == 1 && chunk(0).last, "logits(): this rank does not hold the head");
  return slot(0, 0).logits;
}

}  // namespace pentad
