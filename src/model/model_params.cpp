// The model's parameters (model/model.h): registered from the parameter table
// (model/param_table.h) for this rank's chunks, the ids each forward stretch reads, the MoE
// layers' statistics and expert bias, and what the layers held here cost in FLOPs.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"

namespace pentad {

void Model::build_params() {
  layers_.assign(static_cast<size_t>(cfg_.n_layer), LayerParams{});
  layer_ffn_.assign(static_cast<size_t>(cfg_.n_layer), 0);
  moe_.resize(static_cast<size_t>(cfg_.n_layer));
  partial_.assign(static_cast<size_t>(cfg_.n_layer) + 1, {});
  layer_ids_.resize(static_cast<size_t>(cfg_.n_layer));
  // Parameters in chunk order, each chunk's in the order its forward uses them: backward
  // then finishes them from the end of the arena towards its start.
  for (const ChunkState& chunk : chunks_) {
    if (chunk.range.first) build_embedding();
    for (int64_t l = chunk.range.layer_begin; l < chunk.range.layer_end; ++l) build_layer(l);
    if (chunk.range.last) build_final();
  }
}

int* Model::LayerParams::id(Role role) {
  switch (role) {
    case Role::Norm1W:
      return &norm1_w;
    case Role::Norm1B:
      return &norm1_b;
    case Role::QW:
      return &q_w;
    case Role::QB:
      return &q_b;
    case Role::KW:
      return &k_w;
    case Role::KB:
      return &k_b;
    case Role::VW:
      return &v_w;
    case Role::VB:
      return &v_b;
    case Role::OW:
      return &o_w;
    case Role::OB:
      return &o_b;
    case Role::Norm2W:
      return &norm2_w;
    case Role::Norm2B:
      return &norm2_b;
    case Role::GateW:
      return &gate_w;
    case Role::UpW:
      return &up_w;
    case Role::UpB:
      return &up_b;
    case Role::DownW:
      return &down_w;
    case Role::DownB:
      return &down_b;
    default:
      return nullptr;
  }
}

void Model::build_embedding() {
  for (const ParamDecl& d : table_.embedding) {
    const int id = add_param(params_, d, d.name, *tp_);  // the table vocabulary parallel
    if (d.role == Role::Wte) wte_ = id;
    if (d.role == Role::Wpe) wpe_ = id;
    embed_ids_.push_back(id);
  }
}

void Model::build_layer(int64_t l) {
  const int first_id = static_cast<int>(params_.specs().size());
  const bool moe = is_moe_layer(cfg_, l);
  LayerParams& q = layers_[size_t(l)];
  std::vector<int>& partial = partial_[size_t(l)];
  for (const ParamDecl& d : table_.layer(moe)) {
    if (d.routed) continue;  // the MoE block's
    const int id = add_param(params_, d, layer_prefix(l) + d.name, *tp_);
    if (int* field = q.id(d.role)) *field = id;
    if (d.tp_partial) partial.push_back(id);
  }
  // The MLP: dense, or an MoE layer's shared experts (one MLP as wide as all of them).
  layer_ffn_[size_t(l)] = mlp_width(cfg_, moe) / tp_->heads_degree();
  if (moe) {
    auto& block = moe_[size_t(l)];
    block = std::make_unique<MoeBlock>(cfg_, l, params_, *ep_, *tp_, *cp_, b_, t_,
                                       placement_.device, act_, moe_scratch_);
    partial.push_back(block->router());  // each tp rank routes its own rows (SP)
  }
  for (int id = first_id; id < static_cast<int>(params_.specs().size()); ++id)
    layer_ids_[size_t(l)].push_back(id);
}

void Model::build_final() {
  for (const ParamDecl& d : table_.final) {
    const int id = add_param(params_, d, d.name, *tp_);
    if (d.role == Role::NormFW) normf_w_ = id;
    if (d.role == Role::NormFB) normf_b_ = id;
    if (d.role == Role::Head) head_ = id;
    if (d.tp_partial) partial_.back().push_back(id);
    final_ids_.push_back(id);
  }
  if (!cfg_.tie_embeddings) return;
  if (wte_ >= 0) {
    head_ = wte_;
  } else {
    // The tied table lives on the first stage too: this stage keeps a copy, initialised
    // the same (same name) and kept equal by summing the two gradients every step.
    head_ = embedding_copy_ = add_param(params_, table_.embedding[0], "wte.weight", *tp_);
    params_.mark_pipeline_copy(head_);
  }
  final_ids_.push_back(head_);
}

bool Model::holds_last() const {
  for (const ChunkState& c : chunks_)
    if (c.range.last) return true;
  return false;
}

MoeStats Model::take_moe_stats() {
  MoeStats stats;
  stats.experts = cfg_.n_experts;
  for (size_t l = 0; l < moe_.size(); ++l) {
    if (!moe_[l]) continue;
    stats.layers.push_back(int64_t(l));
    stats.dropped.push_back(0.0);
    moe_[l]->take_stats(stats.counts, stats.dropped.back(), stats.aux, stats.seq_aux, stats.z);
  }
  return stats;
}

void Model::update_expert_bias(const std::vector<double>& counts) {
  size_t i = 0;
  for (const auto& block : moe_)
    if (block) block->update_bias(counts.data() + (i++) * size_t(cfg_.n_experts));
  kernels::refresh_weights(params_);
}

std::vector<std::vector<int>> Model::stretches() const {
  std::vector<std::vector<int>> all;
  if (!embed_ids_.empty()) all.push_back(embed_ids_);
  for (const std::vector<int>& ids : layer_ids_)
    if (!ids.empty()) all.push_back(ids);
  if (!final_ids_.empty()) all.push_back(final_ids_);
  return all;
}

std::vector<int64_t> Model::chunk_param_offsets() const {
  std::vector<int64_t> offsets;
  for (const ChunkState& chunk : chunks_) {
    const LayerRange& r = chunk.range;
    int id = -1;
    if (r.first) id = embed_ids_.front();
    for (int64_t l = r.layer_begin; id < 0 && l < r.layer_end; ++l)
      if (!layer_ids_[size_t(l)].empty()) id = layer_ids_[size_t(l)].front();
    if (id < 0) id = final_ids_.front();
    offsets.push_back(int64_t(params_.spec(id).offset));
  }
  offsets.push_back(params_.numel());
  for (size_t c = 1; c < offsets.size(); ++c)
    PENTAD_CHECK(offsets[c - 1] <= offsets[c], "chunk {}'s parameters begin before chunk {}'s", c,
                 c - 1);
  return offsets;
}

std::vector<int> Model::expert_bias_ids() const {
  std::vector<int> ids;
  for (const auto& block : moe_)
    if (block) ids.push_back(block->bias());
  return ids;
}

double layer_flops_per_token(const ModelConfig& cfg, bool moe, double keys) {
  // A multiply-add per value of each GEMM's weight (model/param_table.h): every weight of
  // the layer once, each routed expert's top_k times (the router and shared experts once).
  double weights = 0;
  const std::shared_ptr<const ParamTable> table = shared_param_table(cfg);
  for (const ParamDecl& d : table->layer(moe))
    if (d.reads != Reads::None)
      weights += double(d.shape[0]) * double(d.shape[1]) * (d.expert() ? double(cfg.top_k) : 1.0);
  // Causal attention: each query meets keys/2 keys on average; QK^T and PV cost 2*C flops per
  // pair each, so 2*C*(keys/2) per token forward, written here in the same units as a parameter.
  const double attention = double(cfg.d_model) * keys;
  return 3.0 * 2.0 * (weights + attention);  // forward + 2x for backward
}

double head_flops_per_token(const ModelConfig& cfg) {
  return 3.0 * 2.0 * static_cast<double>(cfg.vocab_size) * static_cast<double>(cfg.d_model);
}

double Model::flops_per_micro_batch() const {
  const double keys = static_cast<double>(t_ * cp_->degree());  // the whole sequence
  double per_token = holds_last() ? head_flops_per_token(cfg_) : 0.0;
  for (const ChunkState& c : chunks_)
    for (int64_t l = c.range.layer_begin; l < c.range.layer_end; ++l)
      per_token += layer_flops_per_token(cfg_, moe_[size_t(l)] != nullptr, keys);
  // This rank's share of the tensor-parallel work.
  return static_cast<double>(b_ * t_) * per_token / tp_->degree();
}

}  // namespace pentad
