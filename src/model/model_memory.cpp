// The model's activation memory (model/model.h): one slot of a chunk and the scratch shared
// by every pass, laid out from the activation table (model/activations.h) twice (measured,
// then allocated) for a fixed micro-batch; the slots a pipeline adds; and the views it reads
// through.
#include <algorithm>

#include "model/model.h"

namespace pentad {

void Model::plan_slot(ActSink& sink, const LayerRange& chunk, Slot& s) {
  declare_batch(sizes_, sink, s);
  s.resid.clear();
  for (int64_t l = chunk.layer_begin; l <= chunk.layer_end; ++l)
    s.resid.push_back(declare_residual(sizes_, sink));
  s.acts.assign(cfg_.recompute ? 0 : static_cast<size_t>(chunk.layer_end - chunk.layer_begin), {});
  for (size_t i = 0; i < s.acts.size(); ++i) {
    const size_t l = size_t(chunk.layer_begin) + i;
    declare_layer(sizes_, double(layer_ffn_[l]), moe_[l] != nullptr, sink, s.acts[i]);
  }
}

void Model::plan_shared(ActSink& sink) {
  const int64_t F = *std::max_element(layer_ffn_.begin(), layer_ffn_.end());
  declare_scratch(sizes_, double(F), holds_last(), sink, scratch_);
}

int Model::add_slot(int c) {
  ChunkState& chunk = chunks_.at(static_cast<size_t>(c));
  auto s = std::make_unique<Slot>();
  Arena measure = Arena::measuring("activations");
  ArenaSink measuring(measure);
  plan_slot(measuring, chunk.range, *s);
  s->arena = Arena(fmt::format("activations (chunk {} slot {})", c, chunk.slots.size()),
                   measure.used(), placement_.device);
  ArenaSink sink(s->arena);
  plan_slot(sink, chunk.range, *s);
  declared_.bytes += sink.bytes, declared_.buffers += sink.buffers;
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
    for (const auto& s : c.slots) bytes += s->arena.capacity() + s->deferred_arena.capacity();
  return bytes;
}

Tensor Model::logits() const {
  PENTAD_CHECK(chunks() == 1 && chunk(0).last, "logits(): this rank does not hold the head");
  return scratch_.logits;
}

}  // namespace pentad
