// The memory estimate from a recipe alone (plan/memory_budget.h): each pipeline stage's
// parameters, gradients, AdamW state, activations and snapshot, summed from the model's
// tables of parameters and activations (one layer of each kind, times the layers).
// Whether it fits, and the words for it: plan/memory_fit.cpp.
#include "plan/memory_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "model/activations.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "optim/adamw.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/pipeline.h"
#include "plan/layout.h"

namespace pentad {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<parallel::pp::Chunk> chunks_of_stage(const Config& cfg, int stages, int stage) {
  const ParallelConfig& p = cfg.parallel;
  if (stages == 1 && p.virtual_stages == 1 && p.pp_layout.empty())
    return {parallel::pp::Chunk{0, cfg.model.n_layer, true, true}};
  return parallel::pp::stage_chunks(pipeline_chunk_layers(cfg, stages), stages, stage,
                                    p.pp_schedule == "zb-v");
}

// The MoE layers among [begin, end).
double moe_layers_in(const std::vector<int64_t>& moe, int64_t begin, int64_t end) {
  return double(
      std::count_if(moe.begin(), moe.end(), [&](int64_t l) { return begin <= l && l < end; }));
}

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

// One stage's sizes on one rank, in the units its terms are written in. Parameters: the
// model's table (model/param_table.h) summed over this rank's cuts; an MoE layer (model/moe.h)
// holds, besides the shared experts' MLP, the router, the expert bias and n_experts / ep
// routed experts split over etp. Activations: the model's table (model/activations.h) summed,
// set by set.
struct Sizes {
  ActSizes acts;  // the activations' sizes on this rank (rows N, Nl, width C, ...)
  double p = 1, d1 = 1, d2 = 1, act = 4, f32 = 4;
  // MoE layers: E experts, k picks, width Fe (each etp rank 1/etp of it); A rows sent, R
  // received (worst case).
  std::vector<int64_t> moe;
  double E = 0, k = 0, ep = 1, etp = 1, Fe = 0, A = 0, senders = 1, R = 0;
  // Values this rank holds: a dense layer, an MoE layer (of which routed experts), the
  // embedding, its table (the largest parameter) and the final norm and head.
  double layer_values = 0, moe_values = 0, expert_values = 0, embedding = 0, table = 0,
         final_values = 0;
  // Bytes of the activation table's sets: a batch's ids, one residual stream, a dense layer's
  // and an MoE layer's saved activations; an MoE layer's routed rows (dispatch) and its
  // backward's scratch. (A slot keeps nothing of the head: Model::head_backward.)
  double batch = 0, resid = 0, layer_acts = 0, moe_acts = 0, dispatch = 0, dispatch_backward = 0;
  // A split backward's (zb-h1, zb-v), kept per slot from B to W: a dense layer's and an MoE
  // layer's output gradients (its routed experts' at the worst case) and, under recompute,
  // the inputs of its GEMMs (DeferredGrads), the first chunk's d(input); only what is not
  // written over the slot's activations (without sequence parallelism, little or none).
  double deferred_layer = 0, deferred_moe = 0, deferred_first = 0;
};

void add_parameter_values(Sizes& s, const ModelConfig& m, const parallel::MeshConfig& mesh,
                          const ParamTable& table) {
  const CutDegrees degrees{s.p, s.d2, double(mesh.ep), double(mesh.etp)};
  s.layer_values = rank_values(table.dense_layer, degrees, 0).all;
  s.embedding = rank_values(table.embedding, degrees, 0).all;
  s.table = rank_values(table.embedding.front(), degrees);
  s.final_values = rank_values(table.final, degrees, 0).all;
  const RankValues moe_layer =
      m.is_moe() ? rank_values(table.moe_layer, degrees, m.n_experts) : RankValues{};
  s.expert_values = moe_layer.experts;
  s.moe_values = moe_layer.all;
}

// Dispatch (MoeBlock::Acts, model/moe.h) for the most rows it can move (moe_row_bound, which
// MoeBlock sizes its buffers for): A = Nl k permuted rows sent, R rows received.
void add_moe_sizes(Sizes& s, const ModelConfig& m, const parallel::MeshConfig& mesh) {
  s.moe = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  s.E = double(m.n_experts), s.k = double(m.top_k), s.ep = mesh.ep, s.etp = mesh.etp;
  s.Fe = m.is_moe() ? double(expert_ffn_dim(m)) : 0;
  const double E = s.E, k = s.k, ep = s.ep, etp = s.etp, Fe = s.Fe, Nl = s.acts.Nl, N = s.acts.N,
               C = s.acts.C, act = s.act, f32 = s.f32;
  s.senders = ep * etp;
  // The router's capacity counts the whole micro-batch's tokens, over the cp ranks too.
  const MoeRowBound bound = moe_row_bound(Nl, N * mesh.cp, E, k, ep, etp, m.moe.capacity_factor);
  s.A = bound.sent, s.R = bound.received;
  const double A = s.A, R = s.R;
  MoeBlock::Acts rows;
  s.dispatch = bytes_of([&](ActSink& sink) {
    declare_moe_routing(Nl, E, k, sink, rows);
    declare_moe_rows(A, R, C, Fe / etp, s.acts.act, s.acts.gpt2, sink, rows);
  });
  DeferredGrads kept;
  s.deferred_moe = bytes_of([&](ActSink& sink) {
    declare_deferred_layer(s.acts, s.acts.Fs, true, Tensor{}, Tensor{}, sink, kept);
    declare_moe_deferred(Nl, E, R, C, Fe / etp, s.acts.act, s.acts.gpt2, sink, rows);
  });
  // Backward's scratch: the gradients of those rows, and three of width Fe/etp for all of
  // them (the grouped expert GEMMs' d(act), d(gate), d(up)); in bf16 also the router's fp32
  // input and gradient and that gradient cast back (Nl, C) each. (Not the table: MoeBlock's
  // backward holds one of width Fe/etp for GPT-2's experts, and d(logits) (Nl, E) fp32.)
  s.dispatch_backward = act * (2 * A * C + 2 * R * C + 3 * R * (Fe / etp)) + f32 * Nl * k +
                        (act < f32 ? (2 * f32 + act) * Nl * C : 0);
}

Sizes sizes_of(const Config& cfg, const parallel::MeshConfig& mesh, const ParamTable& table) {
  const ModelConfig& m = cfg.model;
  Sizes s;
  // 2D tp (tp = d1 x d2): heads and MLP widths split over d1, a layer's C over d2.
  s.p = mesh.tp, s.d2 = mesh.tp_d2, s.d1 = s.p / s.d2;
  s.act = cfg.train.precision == "bf16" ? 2 : 4;
  // Under context parallelism a rank holds seq_len / cp tokens of each sequence.
  s.acts =
      activation_sizes(m, double(cfg.train.micro_batch), double(cfg.train.seq_len) / mesh.cp, s.p,
                       s.d2, cfg.parallel.sequence_parallel, s.act == 2 ? DType::BF16 : DType::F32);
  const ActSizes& a = s.acts;
  add_parameter_values(s, m, mesh, table);
  SlotActs slot;
  LayerActs layer;
  s.batch = bytes_of([&](ActSink& sink) { declare_batch(a, sink, slot); });
  s.resid = bytes_of([&](ActSink& sink) { declare_residual(a, sink); });
  s.layer_acts = bytes_of([&](ActSink& sink) { declare_layer(a, a.F, false, sink, layer); });
  s.moe_acts = bytes_of([&](ActSink& sink) { declare_layer(a, a.Fs, true, sink, layer); });
  DeferredGrads kept;
  Tensor d_input;
  s.deferred_layer = bytes_of([&](ActSink& sink) {
    declare_deferred_layer(a, a.F, false, Tensor{}, Tensor{}, sink, kept);
  });
  s.deferred_first =
      bytes_of([&](ActSink& sink) { declare_deferred_ends(a, true, Tensor{}, sink, d_input); });
  add_moe_sizes(s, m, mesh);
  return s;
}

// What a stage's chunks hold: the last chunk, MoE layers, dense layers.
struct Holds {
  bool last = false, moe = false, dense = false;
};

Holds holds_of(const Sizes& s, const std::vector<parallel::pp::Chunk>& chunks) {
  Holds holds;
  for (const parallel::pp::Chunk& chunk : chunks) {
    const double layers = double(chunk.layer_end - chunk.layer_begin);
    const double moe_layers = moe_layers_in(s.moe, chunk.layer_begin, chunk.layer_end);
    holds.last = holds.last || chunk.last;
    holds.moe = holds.moe || moe_layers > 0;
    holds.dense = holds.dense || moe_layers < layers;
  }
  return holds;
}

// The MLP width the stage's scratch is made for (Model::plan_shared): its widest layer's.
double widest_ffn(const Sizes& s, const Holds& holds) {
  return std::max(holds.dense ? s.acts.F : 0, holds.moe ? s.acts.Fs : 0);
}

// One micro-batch's slot of a chunk (Model::plan_slot): layers + 1 residual streams, each
// layer's activations unless recomputed (an MoE layer's dispatch buffers stay even then,
// MoeBlock::Acts); a split backward keeps its output gradients
// in the slot too, until W (under recompute W's inputs too).
double chunk_slot_bytes(const Sizes& s, const Config& cfg, const parallel::pp::Chunk& chunk,
                        bool split) {
  const double layers = double(chunk.layer_end - chunk.layer_begin);
  const double moe_layers = moe_layers_in(s.moe, chunk.layer_begin, chunk.layer_end);
  const double kept =
      (cfg.model.recompute ? 0 : (layers - moe_layers) * s.layer_acts + moe_layers * s.moe_acts) +
      moe_layers * s.dispatch;
  const double deferred = !split ? 0
                                 : (layers - moe_layers) * s.deferred_layer +
                                       moe_layers * s.deferred_moe +
                                       (chunk.first ? s.deferred_first : 0);
  return s.batch + (layers + 1) * s.resid + kept + deferred;
}

// Each chunk's parameter values and its activation slots, one per micro-batch the schedule
// keeps in flight on it.
Holds add_chunks(MemoryEstimate& e, const Sizes& s, const Config& cfg,
                 const parallel::MeshConfig& mesh, int stage) {
  const ModelConfig& m = cfg.model;
  const std::vector<parallel::pp::Chunk> chunks = chunks_of_stage(cfg, mesh.pp, stage);
  const parallel::pp::ScheduleSpec spec = schedule_spec(cfg, mesh);
  const bool split = mesh.pp > 1 && spec.splits_backward();
  const bool vee = mesh.pp > 1 && spec.placement().vee;
  std::vector<parallel::pp::Action> actions;
  if (mesh.pp > 1) actions = parallel::pp::stage_actions(spec, stage);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const parallel::pp::Chunk& chunk = chunks[c];
    const double layers = double(chunk.layer_end - chunk.layer_begin);
    const double moe_layers = moe_layers_in(s.moe, chunk.layer_begin, chunk.layer_end);
    e.values += (layers - moe_layers) * s.layer_values + moe_layers * s.moe_values;
    e.expert_values += moe_layers * s.expert_values;
    if (chunk.first) e.values += s.embedding;
    if (chunk.last) {
      e.values += s.final_values;
      // A tied head is the embedding itself on one stage, a copy of it on the last stage;
      // under zb-v's V the first stage holds both, its head's gradient kept apart
      // (Model::set_tied_head_apart).
      if (m.tie_embeddings && mesh.pp > 1 && !vee) e.values += s.table;
      if (m.tie_embeddings && vee) e.activations += s.f32 * s.table;
    }
    const double in_flight =
        actions.empty() ? 1 : std::max(1, parallel::pp::peak_in_flight(actions, int(c)));
    e.activations += in_flight * chunk_slot_bytes(s, cfg, chunk, split);
    e.dispatch += in_flight * moe_layers * s.dispatch;
  }
  return holds_of(s, chunks);
}

// The model's scratch (Model::plan_shared), with the MLP widths of the layers held here; an
// MoE layer's backward adds the gradients of its dispatched rows; 2D tp's and context
// parallelism's exchange buffers, the dispatcher's staging.
void add_shared_scratch(MemoryEstimate& e, const Sizes& s, const Config& cfg,
                        const parallel::MeshConfig& mesh, const Holds& holds) {
  const ModelConfig& m = cfg.model;
  const double N = s.acts.N, C = s.acts.C, d1 = s.d1, act = s.act, f32 = s.f32;
  ScratchActs scratch;
  e.activations += bytes_of([&](ActSink& sink) {
    declare_scratch(s.acts, widest_ffn(s, holds), holds.last, sink, scratch);
  });
  // 2D tp's exchange buffers (parallel/tp/tensor_parallel.cpp): two of N C values without
  // SP, two of N C / tp with it.
  if (s.d2 > 1) e.activations += act * 2 * N * C / (s.acts.sp ? s.p : 1);
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
  if (holds.moe) {
    // The dispatcher's staging (parallel/ep/expert_parallel.h), one for every layer: this
    // etp rank's share of the received rows (R / etp), and with etp > 1 every etp rank's, in
    // the rows' type.
    const double staging = s.senders > 1 ? act * C * (s.R / s.etp + (s.etp > 1 ? s.R : 0)) : 0;
    e.activations += s.dispatch_backward + staging;
    e.dispatch += s.dispatch_backward + staging;
  }
}

// ZeRO over the Z = dp x cp ranks (the routed experts over their edp replicas).
struct ZeroShares {
  int64_t stage = 0;
  double Z = 1, edp = 1;
  double shares = 0;  // this rank's values: 1/Z of the dense values and 1/edp of the experts'
};

ZeroShares zero_shares(const MemoryEstimate& e, const Config& cfg,
                       const parallel::MeshConfig& mesh) {
  ZeroShares z;
  z.stage = mesh.dp * mesh.cp > 1 ? cfg.parallel.zero : 0;
  z.Z = z.stage > 0 ? double(mesh.dp * mesh.cp) : 1.0;
  z.edp = z.stage > 0 ? double(parallel::mesh_degree(mesh, parallel::Axis::EDP)) : 1.0;
  z.shares = (e.values - e.expert_values) / z.Z + e.expert_values / z.edp;
  return z;
}

// Gradients: stage 1 adds the reduced shares S to the full gradients, stage 2 keeps the
// full gradients only while backward fills a bucket (two at most in flight) besides the
// reduced S (later micro-batches add it into the bucket before the reduce-scatter writes
// it back: no second S). A bucket never splits a parameter, so the embedding (or an untied
// head) may make one larger than bucket_mb; at stage 3 a bucket is a unit: a layer or the
// embedding. The experts' reducer
// keeps its own buckets in flight.
double gradient_bytes(const MemoryEstimate& e, const Sizes& s, const ZeroShares& z,
                      const Config& cfg) {
  const double f32 = s.f32;
  const double unit = std::max(s.layer_values, s.embedding) * f32;
  const double bucket_mb = double(cfg.parallel.bucket_mb) * kMiB;
  const double bucket = z.stage == 3 ? unit : std::max(bucket_mb, s.table * f32);
  const double dense_values = e.values - e.expert_values;
  const double expert_bucket = z.stage == 3 ? s.expert_values * f32 : bucket_mb;  // a layer's
  return z.stage == 0   ? e.values * f32
         : z.stage == 1 ? (e.values + z.shares) * f32
                        : std::min(dense_values * f32, 2 * bucket) +
                              std::min(e.expert_values * f32, 2 * expert_bucket) + z.shares * f32;
}

// The allocation unit of a reserved arena on the device (core/device_memory_cuda.cpp asks
// the driver for the recommended granularity: 2 MiB on NVIDIA's GPUs) and on the host.
constexpr double kDeviceGranule = 2 * kMiB, kHostGranule = double(Arena::kPageBytes);

// ZeRO-3: this rank's shares (fp32), and the units whole at once in buffers of their own
// (with a bf16 compute copy, that too); with the shares on NVMe (ZeRO-Infinity) none
// resident, and each reducer's next share on its way. Units: the embedding, each layer's
// dense parameters (an MoE layer's attention, router, bias and shared experts) and its
// routed experts, the final norm and head (and a tied head's copy on the last stage): the
// stretches of this stage's chunks.
// Returns the bytes of the shares the snapshot's spare set holds again.
double add_zero3_parameters(MemoryEstimate& e, const Sizes& s, const ZeroShares& z,
                            const Config& cfg, const parallel::MeshConfig& mesh, bool nvme_params) {
  const ModelConfig& m = cfg.model;
  std::vector<ZeroStretch> stretches;
  const std::vector<parallel::pp::Chunk> chunks = chunks_of_stage(cfg, mesh.pp, int(e.stage));
  // The tied head reads the embedding's unit where this stage holds both.
  const bool tied = m.tie_embeddings && chunks.front().first && chunks.back().last;
  for (const parallel::pp::Chunk& chunk : chunks) {
    if (chunk.first) stretches.push_back({s.embedding, 0});
    for (int64_t l = chunk.layer_begin; l < chunk.layer_end; ++l)
      stretches.push_back(std::find(s.moe.begin(), s.moe.end(), l) != s.moe.end()
                              ? ZeroStretch{s.moe_values - s.expert_values, s.expert_values}
                              : ZeroStretch{s.layer_values, 0});
    const bool copy = m.tie_embeddings && chunk.last && !tied;  // the last stage's copy
    if (chunk.last) stretches.push_back({s.final_values + (copy ? s.table : 0), 0});
  }
  double ahead = 0, experts_ahead = 0;  // the largest share of each reducer's units
  // (elements; on CUDA also the size of the slots that upload shares read from NVMe)
  for (const ZeroStretch& st : stretches) {
    ahead = std::max(ahead, st.dense / z.Z);
    experts_ahead = std::max(experts_ahead, st.experts / z.edp);
  }
  const double gathered = zero3_gathered(stretches, tied, 1, 1, cfg.parallel.zero_live_units);
  const double per_value = e.parameters / e.values;  // bytes (with a bf16 compute copy)
  const double granule = cfg.train.device == "cuda" ? kDeviceGranule : kHostGranule;
  const double backed = zero3_backed_shares(stretches, z.Z, z.edp, s.f32, granule);
  e.parameters = (nvme_params ? (ahead + experts_ahead) * s.f32 : backed) +
                 std::min(e.parameters, gathered * per_value);
  // On CUDA each share read comes up through 3 page-locked slots of the largest share
  // (optim/adamw.h, reserve_param_uploads); on the CPU it lands in the unit's buffer.
  if (nvme_params && cfg.train.device == "cuda")
    e.host = 3 * std::max(ahead, experts_ahead) * s.f32;
  return nvme_params ? z.shares * s.f32 : backed;
}

// Parameters (fp32, and a bf16 compute copy), gradients, AdamW's m and v of this rank's
// shares, ZeRO-3's gathered units, the offloads and the snapshot.
void add_training_state(MemoryEstimate& e, const Sizes& s, const Config& cfg,
                        const parallel::MeshConfig& mesh) {
  const ModelConfig& m = cfg.model;
  const double f32 = s.f32;
  e.parameters = e.values * (f32 + (cfg.train.precision == "bf16" ? 2 : 0));
  const ZeroShares z = zero_shares(e, cfg, mesh);
  const double shares = z.shares;
  e.gradients = gradient_bytes(e, s, z, cfg);
  const double moments = 2 * shares * f32;  // AdamW's m and v of this rank's shares
  e.optimizer = moments;
  const bool nvme = cfg.parallel.offload == "nvme";
  const bool nvme_params = nvme && z.stage == 3 && cfg.parallel.offload_params;
  const double backed_shares =
      z.stage == 3 ? add_zero3_parameters(e, s, z, cfg, mesh, nvme_params) : 0;
  if (nvme) {  // on disk; in memory three sub-groups of m and v (and the parameter shares)
    const double tensors = nvme_params ? 3 : 2;
    e.optimizer = 3 * std::min(tensors * shares * f32,
                               tensors * double(cfg.parallel.nvme_subgroup_kb) * 1024);
  }
  if (cfg.train.save_every > 0)  // values, m and v again (offloaded too: read into staging)
    e.snapshot = (z.stage == 3 ? backed_shares : e.values * f32) + moments;
  // The in-memory level (checkpoint.memory_every, which needs save_every): two more copies,
  // in host memory (/dev/shm), beside the device's total on CUDA.
  if (cfg.checkpoint.memory_every > 0) {
    e.memory_level = 2 * e.snapshot;
    (cfg.train.device == "cuda" ? e.host : e.snapshot) += e.memory_level;
  }
  // CUDA: AdamW on the host holds none of its state on the device. Both offloads update on
  // the host (the "nvme" sub-groups and staging are host memory).
  if (cfg.train.device == "cuda" && cfg.parallel.offload != "none") {
    // optim/host_offload.h: two slots of a chunk (at most AdamW::kChunkElements elements) of
    // parameters and gradients, gradients only when the parameters are in the file.
    const double chunk = std::min(shares, double(AdamW::kChunkElements));
    e.host += e.optimizer + 2 * (nvme_params ? 1 : 2) * chunk * f32;
    e.optimizer = 0;
    // With a gradient reducer, the shard's gradients brought down during backward (4S;
    // not under pipelining with a tied embedding or at ZeRO-2 and -3,
    // Trainer::grads_come_down_early).
    const bool reduces =
        mesh.dp * mesh.cp > 1 || parallel::mesh_degree(mesh, parallel::Axis::EDP) > 1;
    if (reduces && !(mesh.pp > 1 && (m.tie_embeddings || z.stage >= 2))) e.host += shares * f32;
  }
}

// One stage's bytes: its chunks' parameters and activation slots, the scratch they share,
// and the training state of its parameters.
MemoryEstimate estimate_stage(const Config& cfg, const parallel::MeshConfig& mesh, int stage,
                              const ParamTable& table) {
  const Sizes s = sizes_of(cfg, mesh, table);
  MemoryEstimate e;
  e.stage = stage;
  const Holds holds = add_chunks(e, s, cfg, mesh, stage);
  add_shared_scratch(e, s, cfg, mesh, holds);
  add_training_state(e, s, cfg, mesh);
  return e;
}

}  // namespace

double zero3_backed_shares(const std::vector<ZeroStretch>& stretches, double Z, double edp,
                           double value_bytes, double granule) {
  // The planner asks this of every ZeRO-3 layout it ranks, and many share a stage's units
  // and Z: each is walked once.
  std::vector<double> key{Z, edp, value_bytes, granule};
  for (const ZeroStretch& st : stretches) key.insert(key.end(), {st.dense, st.experts});
  static std::mutex mutex;
  static std::map<std::vector<double>, double> walked;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = walked.find(key); it != walked.end()) return it->second;
  }
  const int64_t ranks = int64_t(Z);
  const int64_t step = std::max<int64_t>(1, ranks / 1024);
  double most = 0;
  for (int64_t r = 0; r < ranks; r += step) {
    double at = 0, backed = 0, backed_to = 0;  // bytes; backed_to: the last granule's end
    auto share = [&](double values, double parts, int64_t k) {
      const double begin = at + std::floor(double(k) * values / parts) * value_bytes;
      const double end = at + std::floor(double(k + 1) * values / parts) * value_bytes;
      at += values * value_bytes;
      if (end <= begin) return;
      const double from = std::max(backed_to, std::floor(begin / granule) * granule);
      const double to = std::ceil(end / granule) * granule;
      if (to > from) backed += to - from;
      backed_to = std::max(backed_to, to);
    };
    for (const ZeroStretch& st : stretches) {
      share(st.dense, Z, r);
      share(st.experts, edp, r % int64_t(edp));
    }
    most = std::max(most, backed);
  }
  const std::lock_guard<std::mutex> lock(mutex);
  walked.emplace(std::move(key), most);
  return most;
}

int64_t model_parameters(const Config& cfg) {
  Config whole = cfg;
  whole.parallel = ParallelConfig{};
  whole.parallel.dp = 1;
  return int64_t(estimate_memory(whole, parallel::MeshConfig{}, 0).values);
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh) {
  return estimate_memory(cfg, mesh, *shared_param_table(cfg.model));
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh,
                               const ParamTable& table) {
  MemoryEstimate worst;
  for (int stage = 0; stage < mesh.pp; ++stage) {
    const MemoryEstimate e = estimate_stage(cfg, mesh, stage, table);
    if (stage == 0 || e.total() > worst.total()) worst = e;
  }
  return worst;
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh, int stage) {
  return estimate_stage(cfg, mesh, stage, *shared_param_table(cfg.model));
}

std::vector<double> stage_slot_bytes(const Config& cfg, const parallel::MeshConfig& mesh) {
  const Sizes s = sizes_of(cfg, mesh, *shared_param_table(cfg.model));
  const bool split = mesh.pp > 1 && schedule_spec(cfg).splits_backward();
  std::vector<double> bytes;
  for (int stage = 0; stage < mesh.pp; ++stage) {
    bytes.push_back(0);
    for (const parallel::pp::Chunk& chunk : chunks_of_stage(cfg, mesh.pp, stage))
      bytes.back() += chunk_slot_bytes(s, cfg, chunk, split);
  }
  return bytes;
}

std::vector<double> stage_head_bytes(const Config& cfg, const parallel::MeshConfig& mesh) {
  const Sizes s = sizes_of(cfg, mesh, *shared_param_table(cfg.model));
  std::vector<double> bytes(size_t(mesh.pp), 0.0);
  for (int stage = 0; stage < mesh.pp; ++stage)
    if (const Holds holds = holds_of(s, chunks_of_stage(cfg, mesh.pp, stage)); holds.last)
      bytes[size_t(stage)] = head_scratch_extra_bytes(s.acts, widest_ffn(s, holds));
  return bytes;
}

}  // namespace pentad
