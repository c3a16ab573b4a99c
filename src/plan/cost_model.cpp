// The planner's cost model (plan/cost_model.h; docs/plan.md says what it counts and why).
// Per micro-batch and rank: each layer's GEMMs, attention and element-wise passes timed from
// the machine, each layer's tp/cp/ep collectives from the topology, the stages replayed
// through the schedule simulator (parallel/pp/schedule.h), then the data-parallel reduction
// as the grad reducer overlaps it with backward and the optimizer.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/schedule.h"
#include "plan/cost_parts.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"

namespace pentad {

using cost::element_bytes;
using cost::group_of;
using cost::Links;
using cost::Pass;
using cost::Rates;
using cost::Stages;
using cost::Step;
using parallel::CollectiveOp;

double Machine::rank_peak_flops() const {
  if (gpu) return peak_flops;
  // The node's fastest GEMM: on every core at once, or one core's times the cores (two
  // cores' threads can measure below twice one), shared by its ranks.
  double all = 0, one = 0;
  for (const auto& [flops, rate] : calibration.at_threads(cores).gemm) all = std::max(all, rate);
  for (const auto& [flops, rate] : calibration.at_threads(1).gemm) one = std::max(one, rate);
  return std::max(all, one * cores) / std::max(1, ranks_per_node);
}

double model_flops_per_token(const ModelConfig& m, double keys) {
  const std::vector<int64_t> moe_ids = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  const double dense = layer_flops_per_token(m, false, keys);
  const double moe = m.is_moe() ? layer_flops_per_token(m, true, keys) : 0;
  double flops = head_flops_per_token(m);
  for (int64_t l = 0; l < m.n_layer; ++l)
    flops += std::find(moe_ids.begin(), moe_ids.end(), l) != moe_ids.end() ? moe : dense;
  return flops;
}

namespace {

Step step_of(const Config& cfg, const parallel::MeshConfig& mesh, const Machine& machine,
             const parallel::Topology& topo) {
  const ModelConfig& m = cfg.model;
  const int world = mesh.tp * mesh.cp * mesh.dp * mesh.pp;
  PENTAD_CHECK(topo.ranks >= world, "topology of {} ranks for {}", topo.ranks, world);
  const int node_ranks = std::min(machine.ranks_per_node, world);
  const int threads = machine.gpu ? 1
                      : cfg.train.threads > 0
                          ? int(cfg.train.threads)
                          : std::max(1, machine.cores / std::max(1, node_ranks));
  // Ranks whose threads outnumber the cores each get a share of one: Open MPI's waits spin
  // (yielding, but runnable), so a waiting rank takes its share as a computing one does, and
  // everything a rank does, compute and message copies, stretches by the same factor.
  const double slow =
      machine.gpu ? 1.0 : std::max(1.0, double(node_ranks * threads) / double(machine.cores));
  const Rates rates{machine, machine.gpu ? KernelRates{} : machine.calibration.at_threads(threads),
                    slow};
  // A topology measured on these ranks (`pentad probe`: samples of their collectives) already
  // holds what sharing the cores costs a message; a modelled one (links alone) does not.
  // Among the ranks of one CPU node a message is copied by the cores that compute: what a
  // GPU hides behind compute (2D tp chunks, ring K/V passes, the gradient reduction during
  // backward, ZeRO-3's prefetched gathers) such a group pays in full (Links::overlaps).
  const Links links{topo, topo.collectives.empty() ? slow : 1.0, machine.gpu};

  const double b = double(cfg.train.micro_batch), s = double(cfg.train.seq_len);
  const double n = b * s / mesh.cp;  // rows of this rank
  const double C = double(m.d_model), Ckv = double(m.kv_heads() * m.head_dim());
  const double F = double(ffn_dim(m)), V = double(m.vocab_size), e = element_bytes(cfg);
  const bool gpt2 = m.family == ModelFamily::GPT2, sp = cfg.parallel.sequence_parallel;
  const double tp = mesh.tp, d2 = mesh.tp_d2, d1 = tp / d2;

  std::shared_ptr<const ParamTable> table = shared_param_table(m);
  const CutDegrees degrees{tp, d2, double(mesh.ep), double(mesh.etp)};
  std::vector<LayerGemm> dense_gemms = layer_gemms(table->dense_layer, degrees, false);
  return Step{cfg,     mesh, machine, world,   node_ranks,
              threads, slow, rates,   links,   b,
              s,       n,    C,       Ckv,     F,
              V,       e,    tp,      d2,      d1,
              gpt2,    sp,   table,   degrees, std::move(dense_gemms)};
}

// The seconds of a block's GEMMs (attention: reading norm1's output and the attention's;
// the MLP: norm2's and the activation's) on `rows` rows.
double gemm_seconds(const Step& step, const std::vector<LayerGemm>& gemms, bool mlp, double rows) {
  double seconds = 0;
  for (const LayerGemm& g : gemms)
    if ((g.reads == Reads::Norm2 || g.reads == Reads::Activation) == mlp)
      seconds += step.rates.gemm(rows, g.k, g.n);
  return seconds;
}

// One layer's costs: compute of a dense and of an MoE layer, and each layer's collectives.
struct LayerCosts {
  Pass dense, moe, head;
  double moe_comm_fwd = 0, tp_fwd = 0, tp_bwd = 0, cp_fwd = 0, cp_bwd = 0, head_comm = 0;
};

// One dense layer's compute: the GEMMs of the parameter table's weights (model/
// param_table.h), split (1D) over tp or (2D) their input over d2 and output over d1;
// attention's core and what lies between a column and a row GEMM split over d1 only
// (redundant over d2); norms and residuals over tp with sequence parallelism.
void layer_compute(const Step& step, LayerCosts& costs) {
  const ModelConfig& m = step.cfg.model;
  const parallel::MeshConfig& mesh = step.mesh;
  const Rates& rates = step.rates;
  const Links& links = step.links;
  const ParamTable& table = *step.table;
  const CutDegrees& degrees = step.degrees;
  const int world = step.world;
  const double n = step.n, s = step.s, C = step.C, Ckv = step.Ckv, F = step.F, e = step.e,
               tp = step.tp, d1 = step.d1;
  const bool gpt2 = step.gpt2, sp = step.sp;
  auto gemm_seconds = [&](const std::vector<LayerGemm>& gemms, bool mlp, double rows) {
    return pentad::gemm_seconds(step, gemms, mlp, rows);
  };
  const std::vector<LayerGemm>& dense_gemms = step.dense_gemms;
  Pass dense;
  dense.add_gemm(gemm_seconds(dense_gemms, false, n));
  // Each call sees the whole sequence, or under ring attention one block of it.
  const double ring = mesh.cp > 1 ? double(mesh.cp) / mesh.cp_ulysses : 1.0;
  dense.add_fwd_bwd(rates.attention(6 * n * C * s / d1, s / ring));
  const double norm_elems = 10 * C / (sp ? tp : 1);
  const double between = ((gpt2 ? 2 : 3) * F + (gpt2 ? 0 : 2 * (C + Ckv))) / d1;
  const double layer_elem_bytes = n * (norm_elems + between) * e;
  dense.forward += rates.elementwise(layer_elem_bytes);
  dense.backward += rates.elementwise(2 * layer_elem_bytes);
  Pass attention_part = dense;
  dense.add_gemm(gemm_seconds(dense_gemms, true, n));

  // An MoE layer: the attention half as above, then each rank's routed rows through its
  // experts (balanced: its own rows x top_k, each expert's width over etp, gathered over etp)
  // and the shared experts as a dense MLP; dispatch and combine all-to-alls over ep.
  Pass moe = attention_part;
  double moe_comm_fwd = 0;
  if (m.is_moe()) {
    const double k = double(m.top_k);
    const double rows = (sp ? n / tp : n) * k * mesh.etp;
    const double experts_here = double(m.n_experts) / mesh.ep;
    const double per_expert = rows / experts_here;
    moe.add_gemm(experts_here *
                 gemm_seconds(layer_gemms(table.moe_layer, degrees, true), true, per_expert));
    if (m.n_shared_experts > 0)  // the shared experts: a dense MLP
      moe.add_gemm(gemm_seconds(layer_gemms(table.moe_layer, degrees, false), true, n));
    moe.add_gemm(rates.gemm(sp ? n / tp : n, C, double(m.n_experts)));  // router
    const double sent = (sp ? n / tp : n) * k * C * e;
    if (mesh.ep > 1) {
      std::vector<int> ep_group;  // the ep ranks of world rank 0: stage indices etp apart
      for (int r = 0; r < world && int(ep_group.size()) < mesh.ep; ++r) {
        const parallel::MeshCoords c = parallel::mesh_coords(mesh, r);
        if (c[size_t(parallel::Axis::PP)] == 0 && c[size_t(parallel::Axis::ETP)] == 0 &&
            c[size_t(parallel::Axis::EDP)] == 0)
          ep_group.push_back(r);
      }
      moe_comm_fwd += 2 * links.collective(CollectiveOp::AllToAll, ep_group, sent);
    }
  }
  costs.dense = dense;
  costs.moe = moe;
  costs.moe_comm_fwd = moe_comm_fwd;
}

void tp_costs(const Step& step, LayerCosts& costs) {
  const parallel::MeshConfig& mesh = step.mesh;
  const double n = step.n, tp = step.tp, d2 = step.d2;
  const bool sp = step.sp;
  const Rates& rates = step.rates;
  const Links& links = step.links;
  const Config& cfg = step.cfg;
  const Machine& machine = step.machine;
  const std::vector<LayerGemm>& dense_gemms = step.dense_gemms;
  // Tensor-parallel collectives per dense layer (not overlapped in 1D; 2D chunks hide some).
  double tp_fwd = links.calls(tp_layer_collectives(cfg, mesh, false));
  double tp_bwd = links.calls(tp_layer_collectives(cfg, mesh, true));
  if (machine.engine.tp_comm_overlapped && d2 == 1 && sp && tp > 1) {
    // Megatron-Core's --tp-comm-overlap: each gather or scatter goes in tp pieces, the GEMM
    // on one piece computing while the next travels; what is left exposed is a piece, or
    // the part of the transfer longer than the layer's GEMMs.
    Pass gemms;
    double seconds = 0;
    for (const LayerGemm& g : dense_gemms) seconds += rates.gemm(n, g.k, g.n);
    gemms.add_fwd_bwd(seconds);
    tp_fwd = std::max(tp_fwd - gemms.forward, tp_fwd / tp);
    tp_bwd = std::max(tp_bwd - gemms.backward, tp_bwd / tp);
  }
  costs.tp_fwd = tp_fwd;
  costs.tp_bwd = tp_bwd;
}

void cp_costs(const Step& step, LayerCosts& costs) {
  const ModelConfig& m = step.cfg.model;
  const parallel::MeshConfig& mesh = step.mesh;
  const Rates& rates = step.rates;
  const Links& links = step.links;
  const double b = step.b, s = step.s, n = step.n, C = step.C, e = step.e, d1 = step.d1;
  // Context parallelism (parallel/cp/context_parallel.h's volumes): Ulysses all-to-alls are
  // waited for; ring K/V passes overlap the block they travel behind.
  double cp_fwd = 0, cp_bwd = 0;
  if (mesh.cp > 1) {
    const double U = mesh.cp_ulysses, R = mesh.cp / mesh.cp_ulysses;
    const double hq = double(m.n_head) / d1, hkv = double(m.kv_heads()) / d1;
    const double D = double(m.head_dim()), t = b * s / (U * R);
    const std::vector<int> cp_all = group_of(mesh, parallel::Axis::CP);
    if (U > 1) {
      const std::vector<int> ug(cp_all.begin(), cp_all.begin() + int(U));
      const double s_q = t * hq * D * e, s_kv = U * t * std::max(1.0, hkv / U) * D * e;
      const double one = links.collective(CollectiveOp::AllToAll, ug, s_q + s_kv);
      cp_fwd += 2 * one;
      cp_bwd += 4 * one;
    }
    if (R > 1) {
      const double kvc = U > 1 ? std::max(1.0, hkv / U) : hkv;
      const double kv = 2 * b * (s / R) * kvc * D * e;
      const double pass = links.p2p(cp_all[0], cp_all[size_t(U)], kv);
      const bool hides = links.overlaps({cp_all[0], cp_all[size_t(U)]});
      const double block_fwd = rates.attention(6 * n * C * s / d1, s / R) / 3 / R;
      cp_fwd += (R - 1) * std::max(0.0, pass - (hides ? block_fwd : 0.0));
      cp_bwd += (2 * R - 1) * std::max(0.0, pass - (hides ? 2 * block_fwd : 0.0));
    }
  }
  costs.cp_fwd = cp_fwd;
  costs.cp_bwd = cp_bwd;
}

void head_costs(const Step& step, LayerCosts& costs) {
  const parallel::MeshConfig& mesh = step.mesh;
  const Rates& rates = step.rates;
  const Links& links = step.links;
  const double n = step.n, C = step.C, V = step.V, tp = step.tp, e = step.e;
  // The head (vocabulary-parallel GEMM and cross-entropy, fp32) and the embedding.
  Pass& head = costs.head;
  head.add_gemm(rates.gemm(n, C, V / tp));
  head.forward += rates.elementwise(n * (V / tp) * 4 + n * C * e);
  head.backward += rates.elementwise(2 * n * (V / tp) * 4 + n * C * e);
  const std::vector<int> all_tp = group_of(mesh, parallel::Axis::TP);
  costs.head_comm = all_tp.size() > 1
                        ? 2 * links.collective(CollectiveOp::AllReduce, all_tp, n * 4 * 2)
                        : 0;  // the loss's max and sums over tp, per row
}

Stages stage_costs(const Step& step, const LayerCosts& costs) {
  const ModelConfig& m = step.cfg.model;
  const ParallelConfig& par = step.cfg.parallel;
  const parallel::MeshConfig& mesh = step.mesh;
  const Rates& rates = step.rates;
  const double n = step.n, C = step.C, e = step.e;
  const Pass &dense = costs.dense, &moe = costs.moe, &head = costs.head;
  const double tp_fwd = costs.tp_fwd, tp_bwd = costs.tp_bwd, cp_fwd = costs.cp_fwd,
               cp_bwd = costs.cp_bwd, moe_comm_fwd = costs.moe_comm_fwd,
               head_comm = costs.head_comm;
  Stages out;
  // Per stage: its chunks' layers. Recompute runs each layer's forward again in backward.
  const int p = mesh.pp;
  const std::vector<int64_t> moe_ids = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  auto is_moe = [&](int64_t l) {
    return std::find(moe_ids.begin(), moe_ids.end(), l) != moe_ids.end();
  };
  const std::vector<int64_t> layers = pipeline_chunk_layers(step.cfg, p);
  parallel::pp::SimCosts sim;
  const bool vee = par.pp_schedule == "zb-v";
  std::vector<double> stage_bwd(size_t(p), 0.0), stage_fwd(size_t(p), 0.0);
  std::vector<double> stage_work(size_t(p), 0.0);  // a micro-batch's, every chunk
  std::vector<int> stage_layers(size_t(p), 0);
  double compute_max = 0, tp_max = 0, cp_max = 0, ep_max = 0;
  for (int st = 0; st < p; ++st) {
    double fwd = 0, bwd = 0, weight = 0, tpc = 0, cpc = 0, epc = 0, chunks = 0;
    for (const parallel::pp::Chunk& c : parallel::pp::stage_chunks(layers, p, st, vee)) {
      ++chunks;
      stage_layers[size_t(st)] += int(c.layer_end - c.layer_begin);
      for (int64_t l = c.layer_begin; l < c.layer_end; ++l) {
        const bool mo = is_moe(l);
        const Pass& pass = mo ? moe : dense;
        fwd += pass.forward;
        bwd += pass.backward + (m.recompute ? pass.forward : 0);
        weight += pass.weight;
        tpc += tp_fwd + tp_bwd + (m.recompute ? tp_fwd : 0);
        cpc += cp_fwd + cp_bwd + (m.recompute ? cp_fwd : 0);
        epc += mo ? moe_comm_fwd * (2 + (m.recompute ? 1 : 0)) : 0;
      }
      if (c.first) fwd += rates.elementwise(n * C * e * 2);
      if (c.last) {  // the head's whole backward runs in the forward (Model::head_backward)
        fwd += head.forward + head.backward + head.weight;
        tpc += head_comm;
      }
    }
    const double comm = tpc + cpc + epc;
    // Per chunk (the simulator's unit): the stage's work over its chunks; collectives are
    // split between forward and backward in proportion to compute.
    const double share = fwd / std::max(1e-30, fwd + bwd);
    sim.forward_seconds.push_back((fwd + comm * share) / chunks);
    sim.backward_seconds.push_back((bwd + comm * (1 - share)) / chunks);
    sim.weight_seconds.push_back(weight / chunks);  // collectives all in B
    stage_bwd[size_t(st)] = bwd + comm * (1 - share);
    stage_fwd[size_t(st)] = fwd + comm * share;
    stage_work[size_t(st)] = fwd + bwd + comm;
    if (fwd + bwd > compute_max) {
      compute_max = fwd + bwd;
      tp_max = tpc;
      cp_max = cpc;
      ep_max = epc;
    }
  }
  out.sim = sim;
  out.stage_bwd = stage_bwd;
  out.stage_fwd = stage_fwd;
  out.stage_work = stage_work;
  out.stage_layers = stage_layers;
  out.compute_max = compute_max, out.tp_max = tp_max, out.cp_max = cp_max, out.ep_max = ep_max;
  return out;
}

// The stages replayed through the schedule, with the links between neighbouring stages.
parallel::pp::SimResult replay(const Step& step, Stages& stages) {
  const Config& cfg = step.cfg;
  const parallel::MeshConfig& mesh = step.mesh;
  const Machine& machine = step.machine;
  const Links& links = step.links;
  const double n = step.n, C = step.C, e = step.e, tp = step.tp, slow = step.slow;
  const bool sp = step.sp;
  const int p = mesh.pp, world = step.world, node_ranks = step.node_ranks, threads = step.threads;
  parallel::pp::SimCosts& sim = stages.sim;
  const double boundary = n * C * e / (sp ? tp : 1);  // only the tp rank's rows cross (SP)
  // Each directed link between neighbouring stages (interleaving wraps around): the slow
  // ones between nodes are not always stage 0's.
  if (p > 1) {
    sim.link_seconds.assign(size_t(p) * size_t(p), 0.0);
    for (int st = 0; st < p; ++st)
      for (const int to : {(st + 1) % p, (st + p - 1) % p})
        sim.link_seconds[size_t(st) * size_t(p) + size_t(to)] =
            links.p2p(parallel::mesh_rank(mesh, 0, 0, 0, st),
                      parallel::mesh_rank(mesh, 0, 0, 0, to), boundary);
  }
  parallel::pp::ScheduleSpec spec = schedule_spec(cfg, mesh);
  if (p == 1) spec = {parallel::pp::ScheduleKind::OneFOneB, 1, spec.micro_batches, 1, 1};
  if (slow > 1) {
    // Oversubscribed cores: the stages of a node share them and a stage waiting for input
    // yields its share (Open MPI's waits yield when oversubscribed), so the replay runs the
    // passes at full speed under processor sharing instead of each stretched by `slow`.
    sim.stages_per_node = std::clamp(p * node_ranks / world, 1, p);
    sim.core_share = double(machine.cores) / (threads * std::min(world / p, node_ranks));
    for (double& f : sim.forward_seconds) f /= slow;
    for (double& b : sim.backward_seconds) b /= slow;
    for (double& w : sim.weight_seconds) w /= slow;
  }
  if (spec.splits_backward()) {  // the lists the trainer builds for these passes
    double link = 0;
    for (double t : sim.link_seconds) link = std::max(link, t);
    for (int st = 0; st < p; ++st)
      spec.zb_costs.insert(spec.zb_costs.end(),
                           {sim.forward_seconds[size_t(st)],
                            sim.backward_seconds[size_t(st)] - sim.weight_seconds[size_t(st)],
                            sim.weight_seconds[size_t(st)]});
    spec.zb_costs.push_back(link);
    // In 1/64ths of the largest: layouts whose passes differ by less share their lists
    // (zero_bubble_lists keeps them), which spares the search most of their replays.
    const double unit = *std::max_element(spec.zb_costs.begin(), spec.zb_costs.end()) / 64;
    for (double& c : spec.zb_costs) c = unit > 0 ? std::round(c / unit) : 0.0;
  }
  const parallel::pp::SimResult run = parallel::pp::simulate(spec, sim);
  PENTAD_CHECK(!run.deadlock, "schedule simulation deadlocked");
  return run;
}

}  // namespace

namespace cost {

parallel::Topology fold_slow_links(const parallel::Topology& topo,
                                   const parallel::MeshConfig& mesh) {
  using parallel::Axis;
  parallel::Topology out = topo;
  out.slowed.clear();
  const int world = mesh.tp * mesh.cp * mesh.dp * mesh.pp;
  for (const parallel::SlowLink& l : topo.slowed) {
    if (l.a >= world || l.b >= world) continue;
    parallel::MeshCoords x = parallel::mesh_coords(mesh, l.a), y = parallel::mesh_coords(mesh, l.b);
    for (Axis axis : {Axis::TP, Axis::CP, Axis::DP, Axis::PP})
      if (x[size_t(axis)] == y[size_t(axis)]) x[size_t(axis)] = y[size_t(axis)] = 0;
    auto rank_of = [&](const parallel::MeshCoords& c) {
      return parallel::mesh_rank(mesh, c[size_t(Axis::TP)], c[size_t(Axis::CP)],
                                 c[size_t(Axis::DP)], c[size_t(Axis::PP)]);
    };
    const size_t a = size_t(l.a), b = size_t(l.b), fa = size_t(rank_of(x)), fb = size_t(rank_of(y));
    for (auto [from, to, at, until] : {std::tuple{a, b, fa, fb}, std::tuple{b, a, fb, fa}}) {
      out.latency_s[at][until] = std::max(out.latency_s[at][until], topo.latency_s[from][to]);
      out.bandwidth_Bps[at][until] =
          std::min(out.bandwidth_Bps[at][until], topo.bandwidth_Bps[from][to]);
    }
    out.slowed.push_back({int(fa), int(fb), l.factor});
  }
  return out;
}

}  // namespace cost

Prediction predict_step(const Config& cfg, const parallel::MeshConfig& mesh, const Machine& machine,
                        const parallel::Topology& measured) {
  const parallel::Topology folded =
      measured.slowed.empty() ? parallel::Topology{} : cost::fold_slow_links(measured, mesh);
  const parallel::Topology& topo = measured.slowed.empty() ? measured : folded;
  const Step step = step_of(cfg, mesh, machine, topo);
  LayerCosts costs;
  layer_compute(step, costs);
  tp_costs(step, costs);
  cp_costs(step, costs);
  head_costs(step, costs);
  Stages stages = stage_costs(step, costs);
  const parallel::pp::SimResult run = replay(step, stages);
  // Data parallelism over dp x cp: the fullest stage's fp32 gradients (dp_seconds).
  const MemoryEstimate mem = estimate_memory(cfg, mesh, *step.table);
  double Z = 1;
  const double dp_exposed = cost::dp_seconds(step, mem, stages, run, Z);
  // AdamW over this rank's share (fp32 p, g, m, v read; p, m, v written; a bf16 copy).
  const double optimizer = cost::optimizer_seconds(step, mem.values / Z);
  const ModelConfig& m = cfg.model;
  const double ga = double(cfg.train.grad_accum), slow = step.slow, b = step.b, s = step.s;
  const int p = mesh.pp, world = step.world;
  const double compute_max = stages.compute_max, tp_max = stages.tp_max, cp_max = stages.cp_max,
               ep_max = stages.ep_max;
  const std::vector<double>& stage_work = stages.stage_work;
  Prediction out;
  out.memory_bytes = mem.total();
  out.compute = compute_max * ga;
  out.tp = tp_max * ga;
  out.cp = cp_max * ga;
  out.ep = ep_max * ga;
  // The pipeline: the busiest stage's work and the idle time beyond it. On shared cores the
  // replay's step is the whole of it; the parts above become the node's mean stage (the work
  // its cores do, stretched), and what the replay adds to that is bubble.
  double busiest = *std::max_element(run.busy_seconds.begin(), run.busy_seconds.end());
  const double pipeline = run.step_seconds;
  if (slow > 1) {
    const double mean = std::accumulate(stage_work.begin(), stage_work.end(), 0.0) / double(p);
    const double scale = mean / *std::max_element(stage_work.begin(), stage_work.end());
    out.compute *= scale;
    out.tp *= scale;
    out.cp *= scale;
    out.ep *= scale;
    busiest = std::min(ga * mean, pipeline);
  }
  out.bubble = pipeline - busiest;
  out.dp = dp_exposed;
  out.optimizer = optimizer;
  out.step_seconds = pipeline + dp_exposed + optimizer;
  out.oversubscription = slow;
  const double tokens = b * s * ga * mesh.dp;
  const double flops_per_token = model_flops_per_token(m, s);
  out.tokens_per_second = tokens / out.step_seconds;
  out.flops_per_device = flops_per_token * tokens / out.step_seconds / world;
  out.mfu = out.flops_per_device / machine.rank_peak_flops();
  return out;
}

}  // namespace pentad
