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

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/schedule.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"

namespace pentad {
namespace {

using parallel::CollectiveOp;

// GPU efficiency of a kernel against the datasheet peak (docs/plan.md, "GPU constants").
// GEMMs: a plateau of 74% of dense peak, approached as the smallest side grows (tiles
// underfilled below ~1k; cuBLAS on H100 reaches 650-750 of 989 TFLOP/s on large bf16 GEMMs).
// Fused attention (cuDNN / FlashAttention-2 class, forward + backward, causal flops as
// counted): 40%. Element-wise kernels: 70% of memory bandwidth.
constexpr double kGemmPlateau = 0.74, kGemmSide = 1024.0;
constexpr double kAttentionEfficiency = 0.40;
constexpr double kMemoryEfficiency = 0.70;

struct Rates {  // what one rank computes at
  const Machine& m;
  KernelRates cpu;
  double slow = 1;  // oversubscribed cores: each rank's share of one (see predict_step)

  // One GEMM's forward + backward (3 matmuls of 2 M K N flops).
  double gemm(double M, double K, double N) const {
    const double flops = 6 * M * K * N;
    if (!m.gpu) {
      // On CPU ranks that share their cores the operands come from memory, not from a warm
      // cache as in the kernel table's repeated runs: the three matmuls read the weight
      // three times and write its gradient (4 K N values), and read or write the rows' inputs
      // and outputs six times (3 M K + 3 M N), at the measured memory bandwidth. Packing
      // them is what costs a GEMM with few rows (OpenBLAS packs every operand panel).
      const double bytes = 4.0 * (4 * K * N + 3 * M * (K + N));
      return slow * (Calibration::gemm_seconds(cpu, flops) + bytes / cpu.elementwise_bytes_per_s);
    }
    const double side = std::min({M, K, N});
    return flops / (m.peak_flops * kGemmPlateau * (1 - std::exp(-side / kGemmSide)));
  }
  // `keys`: the keys each call sees (the sequence; a ring block's share of it).
  double attention(double counted_flops, double keys) const {
    return m.gpu ? counted_flops / (m.peak_flops * kAttentionEfficiency)
                 : slow * Calibration::attention_seconds(cpu, counted_flops, keys);
  }
  double elementwise(double bytes) const {
    return m.gpu ? bytes / (m.memory_Bps * kMemoryEfficiency)
                 : slow * bytes / cpu.elementwise_bytes_per_s;
  }
};

// Forward and backward seconds of one piece of work (backward: 2/3 of a GEMM's or attention's
// fwd + bwd, and twice the forward's element-wise bytes).
struct Pass {
  double forward = 0, backward = 0;
  void add_fwd_bwd(double seconds) {
    forward += seconds / 3;
    backward += 2 * seconds / 3;
  }
};

// The topology's predictions, each stretched by `slow` (oversubscribed cores: the copies of
// a message run on a share of a core, as compute does).
struct Links {
  const parallel::Topology& topo;
  double slow = 1;
  bool gpu = true;
  // Whether a transfer among `group` can run while its ranks compute: on GPUs (copy engines,
  // NCCL's own kernels) and between CPU nodes (the network moves the bytes), yes; among the
  // ranks of one CPU node, no: shared memory is copied by the cores that compute.
  bool overlaps(const std::vector<int>& group) const {
    if (gpu || group.size() < 2) return true;
    auto node_of = [&](int r) -> int {
      for (size_t i = 0; i < topo.islands.size(); ++i)
        if (std::find(topo.islands[i].begin(), topo.islands[i].end(), r) != topo.islands[i].end())
          return int(i);
      return -1;
    };
    for (int r : group) {
      const bool other_host = size_t(r) < topo.hosts.size() &&
                              size_t(group[0]) < topo.hosts.size() &&
                              topo.hosts[size_t(r)] != topo.hosts[size_t(group[0])];
      if (other_host || node_of(r) != node_of(group[0])) return true;
    }
    return false;
  }
  double collective(CollectiveOp op, const std::vector<int>& group, double bytes) const {
    return group.size() > 1 ? slow * topo.collective_seconds(op, group, bytes) : 0;
  }
  double p2p(int a, int b, double bytes) const {
    if (a == b || bytes <= 0) return 0;
    return slow * (topo.latency_s[size_t(a)][size_t(b)] +
                   bytes / topo.bandwidth_Bps[size_t(a)][size_t(b)]);
  }
  double calls(const std::vector<CollectiveCall>& list) const {
    double s = 0;
    for (const CollectiveCall& c : list)
      s += collective(c.op, c.group, c.bytes) * (overlaps(c.group) ? 1 - c.hidden : 1.0);
    return s;
  }
};

std::vector<int> group_of(const parallel::MeshConfig& mesh, parallel::Axis axis) {
  std::vector<int> g;
  const int n = parallel::mesh_degree(mesh, axis);
  for (int i = 0; i < n; ++i)
    g.push_back(parallel::mesh_rank(
        mesh, axis == parallel::Axis::TP ? i : 0, axis == parallel::Axis::CP ? i : 0,
        axis == parallel::Axis::DP ? i : 0, axis == parallel::Axis::PP ? i : 0));
  return g;
}

// The 2D tp mesh's groups of tp rank 0: the d2 ranks sharing its heads index i (`hidden`:
// false) or the d1 ranks sharing its hidden index j.
std::vector<int> tp2d_group(const parallel::MeshConfig& mesh, bool d1_group) {
  const parallel::TpPlace zero = parallel::tp_place(mesh, 0);
  std::vector<int> g;
  for (int t = 0; t < mesh.tp; ++t) {
    const parallel::TpPlace p = parallel::tp_place(mesh, t);
    if (d1_group ? p.j == zero.j : p.i == zero.i)
      g.push_back(parallel::mesh_rank(mesh, t, 0, 0, 0));
  }
  return g;
}

double element_bytes(const Config& cfg) {
  return placement(cfg).compute == DType::BF16 ? 2 : 4;
}

}  // namespace

double Machine::rank_peak_flops() const {
  if (gpu) return peak_flops;
  // The node's fastest GEMM: on every core at once, or one core's times the cores (two
  // cores' threads can measure below twice one), shared by its ranks.
  double all = 0, one = 0;
  for (const auto& [flops, rate] : calibration.at_threads(cores).gemm) all = std::max(all, rate);
  for (const auto& [flops, rate] : calibration.at_threads(1).gemm) one = std::max(one, rate);
  return std::max(all, one * cores) / std::max(1, ranks_per_node);
}

std::vector<CollectiveCall> tp_layer_collectives(const Config& cfg,
                                                 const parallel::MeshConfig& mesh, bool backward) {
  std::vector<CollectiveCall> calls;
  if (mesh.tp == 1) return calls;
  const ModelConfig& m = cfg.model;
  const bool sp = cfg.parallel.sequence_parallel;
  const double n = double(cfg.train.micro_batch * cfg.train.seq_len) / mesh.cp;
  const double C = double(m.d_model), e = element_bytes(cfg);
  const double qkv = C + 2.0 * double(m.kv_heads() * m.head_dim());
  const double F = double(ffn_dim(m)), up = m.family == ModelFamily::GPT2 ? F : 2 * F;
  const std::vector<int> all = group_of(mesh, parallel::Axis::TP);
  if (mesh.tp_d2 == 1) {  // Megatron: g after o and after down (forward), f's mirror backward
    for (const char* what : {"attention", "mlp"}) {
      if (sp) {
        calls.push_back(
            {CollectiveOp::AllGather, all, n * C * e, 0, std::string(what) + " gather"});
        calls.push_back(
            {CollectiveOp::ReduceScatter, all, n * C * e, 0, std::string(what) + " scatter"});
      } else {
        calls.push_back({CollectiveOp::AllReduce, all, n * C * e, 0, what});
      }
    }
    return calls;
  }
  const double d2 = mesh.tp_d2, d1 = mesh.tp / mesh.tp_d2;
  const double hidden = double(cfg.parallel.tp_chunks - 1) / double(cfg.parallel.tp_chunks);
  const std::vector<int> g1 = tp2d_group(mesh, true), g2 = tp2d_group(mesh, false);
  // A row-parallel GEMM's output (forward) or a column-parallel one's input gradient
  // (backward): partial sums over d1 of n x C/d2, then the whole rows over d2.
  auto finish_rows = [&](const std::string& what) {
    if (sp) {
      calls.push_back({CollectiveOp::ReduceScatter, g1, n * C / d2 * e, hidden, what + " d1"});
      calls.push_back({CollectiveOp::AllToAll, g2, n * C / (d1 * d2) * e, hidden, what + " d2"});
    } else {
      calls.push_back({CollectiveOp::AllReduce, g1, n * C / d2 * e, hidden, what + " d1"});
      calls.push_back({CollectiveOp::AllGather, g2, n * C * e, hidden, what + " d2"});
    }
  };
  // A column-parallel GEMM's output (forward; its input is split over d2) or a row-parallel
  // one's input gradient (backward): an all-reduce over d2 of n x width/d1.
  auto over_d2 = [&](double width, const std::string& what) {
    calls.push_back({CollectiveOp::AllReduce, g2, n * width / d1 * e, hidden, what + " d2"});
  };
  // With SP, columns j of the whole rows from this rank's sequence shard (gather_hidden:
  // before q/k/v and up forward, before o's and down's input gradient backward): an
  // all-to-all over d2 of this rank's rows, then an all-gather over d1 to n x C/d2.
  if (sp)
    for (const char* what : {"attention entry", "mlp entry"}) {
      calls.push_back(
          {CollectiveOp::AllToAll, g2, n * C / (d1 * d2) * e, 0, std::string(what) + " d2"});
      calls.push_back({CollectiveOp::AllGather, g1, n * C / d2 * e, 0, std::string(what) + " d1"});
    }
  if (!backward) {
    over_d2(qkv, "qkv");
    finish_rows("o");
    over_d2(up, "up");
    finish_rows("down");
  } else {
    over_d2(F, "down grad");
    finish_rows("up grad");
    over_d2(C, "o grad");
    finish_rows("qkv grad");
  }
  return calls;
}

std::string TpShapeChoice::describe(int tp) const {
  return fmt::format("{}x{}{}", tp / d2, d2,
                     d2 > 1 && d2 < tp ? (column_first ? " column" : " row") : "");
}

double model_flops_per_token(const ModelConfig& m, double keys) {
  const std::vector<int64_t> moe_ids = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  double flops = head_flops_per_token(m);
  for (int64_t l = 0; l < m.n_layer; ++l)
    flops += layer_flops_per_token(m, std::find(moe_ids.begin(), moe_ids.end(), l) != moe_ids.end(),
                                   keys);
  return flops;
}

TpShapeChoice choose_tp_shape(const Config& cfg, parallel::MeshConfig mesh,
                              const parallel::Topology& topology) {
  const ModelConfig& m = cfg.model;
  auto seconds = [&](const parallel::MeshConfig& shape) {
    double total = 0;
    for (bool backward : {false, true})
      for (const CollectiveCall& c : tp_layer_collectives(cfg, shape, backward))
        total += topology.collective_seconds(c.op, c.group, c.bytes) * (1.0 - c.hidden);
    return total;
  };
  // Why the layout would refuse a shape ("" if it would not): the mesh's rules, stated once.
  auto refusal = [&](const parallel::MeshConfig& shape) -> std::string {
    try {
      parallel::check_layout(shape, m.d_model, m.n_head, m.n_kv_head, m.vocab_size, ffn_dim(m),
                             m.n_layer, cfg.train.seq_len, cfg.train.micro_batch,
                             cfg.parallel.sequence_parallel);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TpShapeChoice best;
  mesh.tp_d2 = 1;
  mesh.tp_column_first = false;
  best.one_d_seconds = seconds(mesh);
  const std::string one_d = refusal(mesh);
  best.seconds = one_d.empty() ? best.one_d_seconds : std::numeric_limits<double>::infinity();
  best.candidates = one_d.empty() ? fmt::format("{}x1 {:.3g} ms", mesh.tp, best.seconds * 1e3)
                                  : fmt::format("{}x1 does not split the model", mesh.tp);
  std::string two_d;  // each 2D shape's refusal
  for (int d2 = 2; d2 <= mesh.tp; ++d2) {
    if (mesh.tp % d2 != 0) continue;
    mesh.tp_d2 = d2;
    if (const std::string why = refusal(mesh); !why.empty()) {
      two_d += fmt::format("{}{}x{}: {}", two_d.empty() ? "" : "; ", mesh.tp / d2, d2, why);
      continue;
    }
    for (bool column : {false, true}) {
      if (column && d2 == mesh.tp) continue;  // one order only
      mesh.tp_column_first = column;
      const double s = seconds(mesh);
      TpShapeChoice shape;
      shape.d2 = d2;
      shape.column_first = column;
      best.candidates += fmt::format(", {} {:.3g} ms", shape.describe(mesh.tp), s * 1e3);
      if (s < best.seconds) {
        best.seconds = s;
        best.d2 = d2;
        best.column_first = column;
      }
    }
  }
  if (best.seconds == std::numeric_limits<double>::infinity())
    fail(
        "parallel.tp_shape = \"auto\" finds no shape of parallel.tp = {} that splits this model. "
        "1D ({}x1) splits the heads, kv heads and MLP width over all of tp: {}. 2D (d1 x d2) "
        "splits them over d1 and model.d_model over d2: {}. Change parallel.tp, or the model's "
        "sizes",
        mesh.tp, mesh.tp, one_d, two_d.empty() ? "tp has no 2D shape" : two_d);
  return best;
}

Prediction predict_step(const Config& cfg, const parallel::MeshConfig& mesh, const Machine& machine,
                        const parallel::Topology& topo) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& par = cfg.parallel;
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
  const bool gpt2 = m.family == ModelFamily::GPT2, sp = par.sequence_parallel;
  const double tp = mesh.tp, d2 = mesh.tp_d2, d1 = tp / d2;

  // One dense layer's compute: the GEMMs of the parameter table's weights (model/
  // param_table.h), split (1D) over tp or (2D) their input over d2 and output over d1;
  // attention's core and what lies between a column and a row GEMM split over d1 only
  // (redundant over d2); norms and residuals over tp with sequence parallelism.
  const ParamTable table = param_table(m);
  const CutDegrees degrees{tp, d2, double(mesh.ep), double(mesh.etp)};
  const std::vector<LayerGemm> dense_gemms = layer_gemms(table.dense_layer, degrees, false);
  // The seconds of a block's GEMMs (attention: reading norm1's output and the attention's;
  // the MLP: norm2's and the activation's) on `rows` rows.
  auto gemm_seconds = [&](const std::vector<LayerGemm>& gemms, bool mlp, double rows) {
    double seconds = 0;
    for (const LayerGemm& g : gemms)
      if ((g.reads == Reads::Norm2 || g.reads == Reads::Activation) == mlp)
        seconds += rates.gemm(rows, g.k, g.n);
    return seconds;
  };
  Pass dense;
  dense.add_fwd_bwd(gemm_seconds(dense_gemms, false, n));
  // Each call sees the whole sequence, or under ring attention one block of it.
  const double ring = mesh.cp > 1 ? double(mesh.cp) / mesh.cp_ulysses : 1.0;
  dense.add_fwd_bwd(rates.attention(6 * n * C * s / d1, s / ring));
  const double norm_elems = 10 * C / (sp ? tp : 1);
  const double between = ((gpt2 ? 2 : 3) * F + (gpt2 ? 0 : 2 * (C + Ckv))) / d1;
  const double layer_elem_bytes = n * (norm_elems + between) * e;
  dense.forward += rates.elementwise(layer_elem_bytes);
  dense.backward += rates.elementwise(2 * layer_elem_bytes);
  Pass attention_part = dense;
  dense.add_fwd_bwd(gemm_seconds(dense_gemms, true, n));

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
    moe.add_fwd_bwd(experts_here *
                    gemm_seconds(layer_gemms(table.moe_layer, degrees, true), true, per_expert));
    if (m.n_shared_experts > 0)  // the shared experts: a dense MLP
      moe.add_fwd_bwd(gemm_seconds(layer_gemms(table.moe_layer, degrees, false), true, n));
    moe.add_fwd_bwd(rates.gemm(sp ? n / tp : n, C, double(m.n_experts)));  // router
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

  // The head (vocabulary-parallel GEMM and cross-entropy, fp32) and the embedding.
  Pass head;
  head.add_fwd_bwd(rates.gemm(n, C, V / tp));
  head.forward += rates.elementwise(n * (V / tp) * 4 + n * C * e);
  head.backward += rates.elementwise(2 * n * (V / tp) * 4 + n * C * e);
  const std::vector<int> all_tp = group_of(mesh, parallel::Axis::TP);
  const double head_comm = all_tp.size() > 1
                               ? 2 * links.collective(CollectiveOp::AllReduce, all_tp, n * 4 * 2)
                               : 0;  // the loss's max and sums over tp, per row

  // Per stage: its chunks' layers. Recompute runs each layer's forward again in backward.
  const int p = mesh.pp, v = int(par.virtual_stages);
  const std::vector<int64_t> moe_ids = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  auto is_moe = [&](int64_t l) {
    return std::find(moe_ids.begin(), moe_ids.end(), l) != moe_ids.end();
  };
  const std::vector<int64_t> layers = parallel::pp::chunk_layers(m.n_layer, p, v, par.pp_layout);
  parallel::pp::SimCosts sim;
  std::vector<double> stage_bwd(size_t(p), 0.0), stage_fwd(size_t(p), 0.0);
  std::vector<double> stage_work(size_t(p), 0.0);  // a micro-batch's, every chunk
  std::vector<int> stage_layers(size_t(p), 0);
  double compute_max = 0, tp_max = 0, cp_max = 0, ep_max = 0;
  for (int st = 0; st < p; ++st) {
    double fwd = 0, bwd = 0, tpc = 0, cpc = 0, epc = 0, chunks = 0;
    for (const parallel::pp::Chunk& c : parallel::pp::stage_chunks(layers, p, st)) {
      ++chunks;
      stage_layers[size_t(st)] += int(c.layer_end - c.layer_begin);
      for (int64_t l = c.layer_begin; l < c.layer_end; ++l) {
        const bool mo = is_moe(l);
        const Pass& pass = mo ? moe : dense;
        fwd += pass.forward;
        bwd += pass.backward + (m.recompute ? pass.forward : 0);
        tpc += tp_fwd + tp_bwd + (m.recompute ? tp_fwd : 0);
        cpc += cp_fwd + cp_bwd + (m.recompute ? cp_fwd : 0);
        epc += mo ? moe_comm_fwd * (2 + (m.recompute ? 1 : 0)) : 0;
      }
      if (c.first) fwd += rates.elementwise(n * C * e * 2);
      if (c.last) {
        fwd += head.forward;
        bwd += head.backward;
        tpc += head_comm;
      }
    }
    const double comm = tpc + cpc + epc;
    // Per chunk (the simulator's unit): the stage's work over its chunks; collectives are
    // split between forward and backward in proportion to compute.
    const double share = fwd / std::max(1e-30, fwd + bwd);
    sim.forward_seconds.push_back((fwd + comm * share) / chunks);
    sim.backward_seconds.push_back((bwd + comm * (1 - share)) / chunks);
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
  parallel::pp::ScheduleSpec spec = schedule_spec(cfg);
  if (p == 1) spec = {parallel::pp::ScheduleKind::OneFOneB, 1, spec.micro_batches, 1, 1};
  if (slow > 1) {
    // Oversubscribed cores: the stages of a node share them and a stage waiting for input
    // yields its share (Open MPI's waits yield when oversubscribed), so the replay runs the
    // passes at full speed under processor sharing instead of each stretched by `slow`.
    sim.stages_per_node = std::clamp(p * node_ranks / world, 1, p);
    sim.core_share = double(machine.cores) / (threads * std::min(world / p, node_ranks));
    for (double& f : sim.forward_seconds) f /= slow;
    for (double& b : sim.backward_seconds) b /= slow;
  }
  const parallel::pp::SimResult run = parallel::pp::simulate(spec, sim);
  PENTAD_CHECK(!run.deadlock, "schedule simulation deadlocked");
  const double ga = double(cfg.train.grad_accum);

  // Data parallelism over dp x cp: the fullest stage's fp32 gradients. Buckets reduce while
  // backward goes on (parallel/dp/grad_reducer.h): below stage 2 during the step's last
  // micro-batch's backward, at stage 2 and 3 during every one's; what outlasts backward, and
  // at least the last bucket, is waited for. ZeRO >= 1 all-gathers the updated values after
  // the optimizer; stage 3 gathers every unit before its forward and backward (prefetched).
  const MemoryEstimate mem = estimate_memory(cfg, mesh);
  const double grad_bytes = 4 * mem.values;
  std::vector<int> dp_group;
  for (int c = 0; c < mesh.cp; ++c)
    for (int d = 0; d < mesh.dp; ++d) dp_group.push_back(parallel::mesh_rank(mesh, 0, c, d, 0));
  const double Z = par.zero > 0 ? double(dp_group.size()) : 1.0;
  double dp_exposed = 0;
  if (dp_group.size() > 1) {
    // The last bucket to finish is the first stage's first: the embedding, whose gradient is
    // final only at the very end of backward, and a bucket never splits a parameter, so it
    // holds the whole table (V C / tp, and GPT-2's positions) even beyond bucket_mb.
    const double embedding = 4 * (V * C / tp + (gpt2 ? double(m.max_seq_len) * C : 0.0));
    const double bucket =
        std::min(grad_bytes, std::max(double(par.bucket_mb) * 1024 * 1024, embedding));
    const CollectiveOp reduce =
        par.zero > 0 ? CollectiveOp::ReduceScatter : CollectiveOp::AllReduce;
    const double all = links.collective(reduce, dp_group, grad_bytes);
    const double last = links.collective(reduce, dp_group, bucket);
    const double window =
        links.overlaps(dp_group) ? *std::max_element(stage_bwd.begin(), stage_bwd.end()) : 0.0;
    double per_reduction = std::max(all - window, last);
    if (!machine.gpu && window > 0 && (par.zero > 0 || par.ring_all_reduce)) {
      // Between CPU nodes the reduction is pentad's ring over send/recv (ZeRO >= 1's
      // reduce-scatter always, ZeRO 0's all-reduce by default: parallel/ring_all_reduce.cpp),
      // and without a progress thread a ring moves a leg only when its rank polls it: backward
      // polls kPollsPerLayer times a layer (Model::layer_backward), one leg of every bucket in
      // flight each time. A layer's bucket, ready after its backward, has the polls of the
      // layers after it; the legs left over run after backward, bucket after bucket, as does
      // the whole of the embedding's, ready last.
      constexpr double kPollsPerLayer = 4;
      const double ranks = double(dp_group.size());
      const double legs = par.zero > 0 ? ranks - 1 : 2 * (ranks - 1);
      const int most = std::max(1, *std::max_element(stage_layers.begin(), stage_layers.end()));
      const double layer_bytes = std::max(0.0, grad_bytes - bucket) / most;
      const double one_layer = links.collective(reduce, dp_group, layer_bytes);
      double polled = last;
      for (int k = 0; k < most; ++k)
        polled += std::max(0.0, 1 - kPollsPerLayer * (most - 1 - k) / legs) * one_layer;
      per_reduction = std::max(per_reduction, polled);
    }
    const double reductions = par.zero >= 2 ? ga : 1;
    dp_exposed = per_reduction * reductions;
    if (par.zero >= 1) {
      // The updated values, as pentad gathers them (fp32, waited for after the optimizer) or
      // as the engine does: in the compute type, each bucket behind the next step's first
      // forward of this stage, so that only the first bucket and what outlasts the forward
      // show (Megatron-Core's buckets: max(40 M, 1 M x dp) values).
      const Engine& engine = machine.engine;
      const double bytes = engine.param_gather_in_compute_type ? e * mem.values : grad_bytes;
      double gather = links.collective(CollectiveOp::AllGather, dp_group, bytes);
      if (engine.param_gather_overlapped && links.overlaps(dp_group)) {
        const double first_bucket =
            std::min(bytes, bytes / mem.values * std::max(40e6, 1e6 * double(dp_group.size())));
        const double forward = *std::max_element(stage_fwd.begin(), stage_fwd.end());
        gather = std::max(links.collective(CollectiveOp::AllGather, dp_group, first_bucket),
                          gather - forward);
      }
      dp_exposed += gather;
    }
    if (par.zero == 3) {
      const double gathers =
          2 * ga * links.collective(CollectiveOp::AllGather, dp_group, grad_bytes);
      dp_exposed += std::max(0.0, gathers - (links.overlaps(dp_group) ? run.step_seconds : 0.0));
    }
  }
  if (p > 1 && m.tie_embeddings) {
    // Tied embeddings under pipelining: the first and last stages' tables (fp32 gradients,
    // each rank's ZeRO share) summed between the two after the reduction, waited for.
    const double table = 4 * V * C / tp / Z;
    dp_exposed += links.collective(CollectiveOp::AllReduce,
                                   {0, parallel::mesh_rank(mesh, 0, 0, 0, p - 1)}, table);
  }

  // AdamW over this rank's share (fp32 p, g, m, v read; p, m, v written; a bf16 copy).
  const double share = mem.values / Z;
  double optimizer = 0;
  if (!machine.gpu) {
    optimizer = slow * share / rates.cpu.adamw_params_per_s;
  } else if (par.offload == "cpu") {  // on the host: gradients down, values up over PCIe
    optimizer = share * 28 / 50e9 + share * 8 / machine.host_link_Bps;
  } else {
    optimizer = share * 30 / (machine.memory_Bps * kMemoryEfficiency);
  }

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
