// The memory estimate from a recipe alone (plan/memory_budget.h): each pipeline stage's
// parameters, gradients, AdamW state, activations and snapshot, in closed form over the
// layer shapes. Whether it fits, and the words for it: plan/memory_fit.cpp.
#include "plan/memory_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "optim/adamw.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/pipeline.h"

namespace pentad {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<parallel::pp::Chunk> chunks_of_stage(const Config& cfg, int stages, int stage) {
  const ParallelConfig& p = cfg.parallel;
  if (stages == 1 && p.virtual_stages == 1 && p.pp_layout.empty())
    return {parallel::pp::Chunk{0, cfg.model.n_layer, true, true}};
  return parallel::pp::stage_chunks(
      parallel::pp::chunk_layers(cfg.model.n_layer, stages, int(p.virtual_stages), p.pp_layout),
      stages, stage);
}

// The MoE layers among [begin, end).
double moe_layers_in(const std::vector<int64_t>& moe, int64_t begin, int64_t end) {
  return double(
      std::count_if(moe.begin(), moe.end(), [&](int64_t l) { return begin <= l && l < end; }));
}

// ZeRO-3 (the hooks of train/parallelize.cpp): one stretch's values in the dense reducer's
// units and in the experts'.
struct ZeroStretch {
  double dense = 0, experts = 0;
};

// The most values whole at once, the dense units' weighted by `dense` and the experts' by
// `experts` (the part of a unit that is not this rank's share; 1 with the shares on NVMe),
// walking forward and backward as the hooks do: the stretch computing and, while a reducer
// holds fewer than `live` units (parallel.zero_live_units), its next unit prefetched, the
// experts' also from a stretch without any. A tied head reads the embedding in the final
// stretch (two dense units), and backward prefetches nothing from there; the embedding's
// backward reads no parameter.
double zero3_gathered(const std::vector<ZeroStretch>& s, bool tied, double dense, double experts,
                      int64_t live) {
  const size_t last = s.size() - 1;
  auto next_experts = [&](size_t k, bool backward) {
    if (backward) {
      for (size_t j = k; j-- > 0;)
        if (s[j].experts > 0) return s[j].experts;
    } else {
      for (size_t j = k + 1; j <= last; ++j)
        if (s[j].experts > 0) return s[j].experts;
    }
    return 0.0;
  };
  // Stretch k's own units and values (the tied head's stretch reads the embedding's unit).
  auto reads = [&](size_t k) { return tied && k == last ? 2 : 1; };
  auto own = [&](size_t k) { return s[k].dense + (tied && k == last ? s[0].dense : 0); };
  auto experts_whole = [&](size_t k, bool backward) {
    const int units = s[k].experts > 0 ? 1 : 0;
    return s[k].experts + (units < live ? next_experts(k, backward) : 0);
  };
  double most = 0;
  for (size_t k = 0; k <= last; ++k) {  // forward
    const double d = own(k) + (reads(k) < live && k < last ? s[k + 1].dense : 0);
    most = std::max(most, d * dense + experts_whole(k, false) * experts);
  }
  for (size_t k = last; k >= 1; --k) {  // backward
    const double d = own(k) + (reads(k) < live && !(tied && k == last) ? s[k - 1].dense : 0);
    most = std::max(most, d * dense + experts_whole(k, true) * experts);
  }
  return most;
}

// One stage's bytes. Parameters: the model's table (model/param_table.h) summed over one tp
// rank's cuts; an MoE layer (model/moe.h) holds, besides the shared experts' MLP, the
// router, the expert bias and n_experts / ep routed experts split over etp. Activations:
// shapes as in Model::plan_layer, plan_slot and plan_shared.
MemoryEstimate estimate_stage(const Config& cfg, const parallel::MeshConfig& mesh, int stage) {
  const ModelConfig& m = cfg.model;
  const bool gpt2 = m.family == ModelFamily::GPT2, sp = cfg.parallel.sequence_parallel;
  const double p = mesh.tp, C = double(m.d_model), V = double(m.vocab_size), F = double(ffn_dim(m));
  // 2D tp (tp = d1 x d2): heads and MLP widths split over d1, a layer's C over d2; the
  // gathered norm outputs are (N, C / d2) and, with SP or 2D, rows live apart from them.
  const double d2 = mesh.tp_d2, d1 = p / d2;
  const bool apart = sp || mesh.tp_d2 > 1;
  const double Ckv = double(m.kv_heads()) * double(m.head_dim());
  // Under context parallelism a rank holds seq_len / cp tokens of each sequence.
  const double b = double(cfg.train.micro_batch), t = double(cfg.train.seq_len) / mesh.cp;
  const double N = b * t, Nl = sp ? N / p : N;  // rows: whole, and this rank's
  const double act = cfg.train.precision == "bf16" ? 2 : 4, f32 = 4;
  const double mlp_mats = gpt2 ? 2 : 3;  // up, down (+ gate)

  const CutDegrees degrees{p, double(mesh.tp_d2), double(mesh.ep), double(mesh.etp)};
  const double layer_values = rank_values(layer_params(m, false), degrees, 0).all;
  const std::vector<ParamDecl> embedding_decls = embedding_params(m);
  const double embedding = rank_values(embedding_decls, degrees, 0).all;
  const double table = rank_values(embedding_decls[0], degrees);  // the largest parameter
  const double final_values = rank_values(final_params(m), degrees, 0).all;
  const double attn_acts = act * (2 * N * C / d2 + Nl * C + 2 * N * (C / d1) + 2 * N * (Ckv / d1)) +
                           f32 * ((gpt2 ? 4 : 2) * Nl + b * t * double(m.n_head) / d1);
  const double layer_acts = attn_acts + act * mlp_mats * N * (F / d1);

  // MoE layers: E experts, k picks, width Fe (each etp rank 1/etp of it), shared width Fs.
  const std::vector<int64_t> moe = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  const double E = double(m.n_experts), k = double(m.top_k), ep = mesh.ep, etp = mesh.etp;
  const double Fe = m.is_moe() ? double(expert_ffn_dim(m)) : 0;
  const double Fs = double(m.n_shared_experts) * Fe;
  const RankValues moe_layer =
      m.is_moe() ? rank_values(layer_params(m, true), degrees, m.n_experts) : RankValues{};
  const double expert_values = moe_layer.experts, moe_values = moe_layer.all;
  // Dispatch (MoeBlock::Acts: rows in the activations' type, routing in fp32), worst case:
  // each of the ep x etp ranks that send to
  // this one routes all its Nl rows here, each to min(k, E / ep) of its local experts; with
  // a capacity, a local expert takes at most min(Nl, capacity) rows from each of them.
  // Sent: A = Nl k permuted rows and their outputs; received: R rows in and out and their
  // activations; the router's logits, scores, picks, weights and positions.
  const double A = Nl * k, senders = ep * etp;
  double R = senders * Nl * std::min(k, E / ep);
  if (m.moe.capacity_factor > 0) {
    const double capacity = std::ceil(double(m.moe.capacity_factor) * N * k / E);
    R = std::min(R, E / ep * senders * std::min(Nl, capacity));
  }
  const double dispatch = act * (2 * A * C + 2 * R * C + mlp_mats * R * (Fe / etp)) +
                          f32 * (2 * Nl * E + 3 * Nl * k + A);
  // Backward's scratch: the gradients of those rows, and three of width Fe/etp for all of
  // them (the grouped expert GEMMs' d(act), d(gate), d(up)); in bf16 also the router's fp32
  // input and gradient and that gradient cast back (Nl, C) each.
  const double dispatch_backward = act * (2 * A * C + 2 * R * C + 3 * R * (Fe / etp)) +
                                   f32 * Nl * k + (act < f32 ? (2 * f32 + act) * Nl * C : 0);
  const double moe_acts = attn_acts + (Fs > 0 ? act * mlp_mats * N * (Fs / d1) : 0) + dispatch +
                          (d2 > 1 ? act * Nl * C : 0);  // 2D: the routed experts' rows apart

  const double head_acts =
      act * (N * C + (sp ? Nl * C : 0) + N * V / p) + f32 * ((gpt2 ? 2 : 1) * Nl + N);

  MemoryEstimate e;
  e.stage = stage;
  const std::vector<parallel::pp::Chunk> chunks = chunks_of_stage(cfg, mesh.pp, stage);
  std::vector<parallel::pp::Action> actions;
  if (mesh.pp > 1) actions = parallel::pp::stage_actions(schedule_spec(cfg), stage);
  bool holds_last = false, holds_moe = false, holds_dense = false;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const parallel::pp::Chunk& chunk = chunks[c];
    const double layers = double(chunk.layer_end - chunk.layer_begin);
    const double moe_layers = moe_layers_in(moe, chunk.layer_begin, chunk.layer_end);
    holds_moe = holds_moe || moe_layers > 0;
    holds_dense = holds_dense || moe_layers < layers;
    e.values += (layers - moe_layers) * layer_values + moe_layers * moe_values;
    e.expert_values += moe_layers * expert_values;
    if (chunk.first) e.values += embedding;
    if (chunk.last) {
      holds_last = true;
      e.values += final_values;
      // A tied head is the embedding itself on one stage, a copy of it on the last stage.
      if (m.tie_embeddings && mesh.pp > 1) e.values += table;
    }
    // One activation slot per micro-batch the schedule keeps in flight on this chunk.
    double in_flight = 1;
    if (!actions.empty()) {
      std::vector<parallel::pp::Action> mine;
      for (const parallel::pp::Action& a : actions)
        if (a.chunk == int(c)) mine.push_back(a);
      in_flight = std::max(1, parallel::pp::peak_in_flight(mine));
    }
    // The dispatch buffers stay per micro-batch even under recompute (MoeBlock::Acts).
    const double kept =
        (m.recompute ? 0
                     : (layers - moe_layers) * layer_acts + moe_layers * (moe_acts - dispatch)) +
        moe_layers * dispatch;
    const double slot = 8 * N + (layers + 1) * Nl * C * act + kept + (chunk.last ? head_acts : 0);
    e.activations += in_flight * slot;
    e.dispatch += in_flight * moe_layers * dispatch;
  }
  // Scratch shared by every layer: backward's gradients, the projection output, and the
  // recomputed layer's activations, with the MLP widths of the layers held here; an MoE
  // model adds the routed output, and an MoE layer's backward the gradients of its
  // dispatched rows.
  const double widest = std::max(holds_dense ? F : 0, holds_moe ? Fs : 0) / d1;
  e.activations += act * (N * C + Nl * C + (apart ? N * C : 0) + N * C + (apart ? 2 * Nl * C : 0) +
                          2 * N * (C / d1) + 2 * N * (Ckv / d1) + mlp_mats * N * widest) +
                   (m.recompute ? attn_acts + act * mlp_mats * N * widest : 0) +
                   (m.is_moe() ? act * Nl * C : 0) + (p > 1 && holds_last ? 3 * f32 * N : 0);
  // 2D tp's exchange buffers (parallel/tp/tensor_parallel.cpp): two of N C values without
  // SP, two of N C / tp with it.
  if (d2 > 1) e.activations += act * 2 * N * C / (sp ? p : 1);
  // Context parallelism's scratch (parallel/cp/context_parallel.cpp), shared by the layers:
  // Ulysses' exchange buffers and head-sharded q, k, v, out and gradients; the ring's two
  // K/V blocks, three dK/dV partials and one block's output.
  if (mesh.cp > 1) {
    const double U = mesh.cp_ulysses, R = mesh.cp / U, D = double(m.head_dim());
    const double kv_heads = std::max(1.0, double(m.kv_heads()) / d1 / U), slice = N * U;
    const double replica = U * d1 > double(m.kv_heads()) ? N * double(m.kv_heads()) / d1 * D : 0;
    if (U > 1)
      e.activations += act * (2 * N * std::max(C / d1, U * kv_heads * D) + 4 * N * (C / d1) +
                              4 * slice * kv_heads * D + replica);
    if (R > 1)
      e.activations += act * (10 * slice * kv_heads * D + N * (C / d1)) + f32 * N * m.n_head / d1;
  }
  if (holds_moe) {
    // The dispatcher's staging (parallel/ep/expert_parallel.h), one for every layer: this
    // etp rank's share of the received rows (R / etp), and with etp > 1 every etp rank's, in
    // the rows' type.
    const double staging = senders > 1 ? act * C * (R / etp + (etp > 1 ? R : 0)) : 0;
    e.activations += dispatch_backward + staging;
    e.dispatch += dispatch_backward + staging;
  }
  e.parameters = e.values * (f32 + (cfg.train.precision == "bf16" ? 2 : 0));
  // ZeRO over the Z = dp x cp ranks (the routed experts over their edp replicas): AdamW's m
  // and v for this rank's shares S, 1/Z of the dense values and 1/edp of the experts'; stage 1
  // adds the reduced S to the full gradients, stage 2 keeps the full gradients only while
  // backward fills a bucket (two at most in flight) besides the reduced S (later micro-batches
  // add it into the bucket before the reduce-scatter writes it back: no second S).
  const int64_t zero = mesh.dp * mesh.cp > 1 ? cfg.parallel.zero : 0;
  const double Z = zero > 0 ? double(mesh.dp * mesh.cp) : 1.0;
  const double edp = zero > 0 ? double(parallel::mesh_degree(mesh, parallel::Axis::EDP)) : 1.0;
  const double shares = (e.values - e.expert_values) / Z + e.expert_values / edp;
  // A bucket never splits a parameter, so the embedding (or an untied head, V C / p) may
  // make one larger than bucket_mb; at stage 3 a bucket is a unit: a layer or the embedding
  // (zero >= 2 runs without pp, so this stage holds both). The experts' reducer keeps its
  // own buckets in flight.
  const double unit = std::max(layer_values, embedding) * f32;
  const double bucket_mb = double(cfg.parallel.bucket_mb) * kMiB;
  const double bucket = zero == 3 ? unit : std::max(bucket_mb, table * f32);
  const double dense_values = e.values - e.expert_values;
  const double expert_bucket = zero == 3 ? expert_values * f32 : bucket_mb;  // a layer's experts
  e.gradients = zero == 0   ? e.values * f32
                : zero == 1 ? (e.values + shares) * f32
                            : std::min(dense_values * f32, 2 * bucket) +
                                  std::min(e.expert_values * f32, 2 * expert_bucket) + shares * f32;
  const double moments = 2 * shares * f32;  // AdamW's m and v of this rank's shares
  e.optimizer = moments;
  const bool nvme = cfg.parallel.offload == "nvme";
  const bool nvme_params = nvme && zero == 3 && cfg.parallel.offload_params;
  if (zero == 3) {
    // This rank's shares (fp32), and the units whole at once in buffers of their own (with a
    // bf16 compute copy, that too); with the shares on NVMe (ZeRO-Infinity) none resident,
    // and each reducer's next share on its way. Units: the embedding, each layer's dense parameters
    // (an MoE layer's attention, router, bias and shared experts) and its routed experts,
    // the final norm and head (zero 3 runs without pp: every stretch is on this rank).
    std::vector<ZeroStretch> stretches = {{embedding, 0}};
    for (int64_t l = 0; l < m.n_layer; ++l)
      stretches.push_back(std::find(moe.begin(), moe.end(), l) != moe.end()
                              ? ZeroStretch{moe_values - expert_values, expert_values}
                              : ZeroStretch{layer_values, 0});
    stretches.push_back({final_values, 0});
    double ahead = 0, experts_ahead = 0;  // the largest share of each reducer's units
    // (elements; on CUDA also the size of the slots that upload shares read from NVMe)
    for (const ZeroStretch& st : stretches) {
      ahead = std::max(ahead, st.dense / Z);
      experts_ahead = std::max(experts_ahead, st.experts / edp);
    }
    const double gathered =
        zero3_gathered(stretches, m.tie_embeddings, 1, 1, cfg.parallel.zero_live_units);
    const double per_value = e.parameters / e.values;  // bytes (with a bf16 compute copy)
    e.parameters = (nvme_params ? ahead + experts_ahead : shares) * f32 +
                   std::min(e.parameters, gathered * per_value);
    // On CUDA each share read comes up through 3 page-locked slots of the largest share
    // (optim/adamw.h, reserve_param_uploads); on the CPU it lands in the unit's buffer.
    if (nvme_params && cfg.train.device == "cuda")
      e.host = 3 * std::max(ahead, experts_ahead) * f32;
  }
  if (nvme) {  // on disk; in memory three sub-groups of m and v (and the parameter shares)
    const double tensors = nvme_params ? 3 : 2;
    e.optimizer = 3 * std::min(tensors * shares * f32,
                               tensors * double(cfg.parallel.nvme_subgroup_kb) * 1024);
  }
  if (cfg.train.save_every > 0)  // values, m and v again (offloaded too: read into staging)
    e.snapshot = (zero == 3 ? shares : e.values) * f32 + moments;
  // CUDA: AdamW on the host holds none of its state on the device.
  if (cfg.train.device == "cuda") {
    // Both offloads update on the host (the "nvme" sub-groups and staging are host memory).
    if (cfg.parallel.offload != "none") {
      // optim/host_offload.h: two slots of a chunk (at most AdamW::kChunkElements elements) of
      // parameters and gradients, gradients only when the parameters are in the file.
      const double chunk = std::min(shares, double(AdamW::kChunkElements));
      e.host += e.optimizer + 2 * (nvme_params ? 1 : 2) * chunk * f32;
      e.optimizer = 0;
      // With a gradient reducer, the shard's gradients brought down during backward (4S;
      // not under pipelining with a tied embedding, Trainer::download_grads_during_backward).
      const bool reduces =
          mesh.dp * mesh.cp > 1 || parallel::mesh_degree(mesh, parallel::Axis::EDP) > 1;
      if (reduces && !(mesh.pp > 1 && m.tie_embeddings)) e.host += shares * f32;
    }
  }
  return e;
}

}  // namespace

int64_t model_parameters(const Config& cfg) {
  Config whole = cfg;
  whole.parallel = ParallelConfig{};
  whole.parallel.dp = 1;
  return int64_t(estimate_memory(whole, parallel::MeshConfig{}, 0).values);
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh) {
  MemoryEstimate worst;
  for (int stage = 0; stage < mesh.pp; ++stage) {
    const MemoryEstimate e = estimate_stage(cfg, mesh, stage);
    if (stage == 0 || e.total() > worst.total()) worst = e;
  }
  return worst;
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh, int stage) {
  return estimate_stage(cfg, mesh, stage);
}

}  // namespace pentad
