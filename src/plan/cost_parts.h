#pragma once
// What the cost model's parts share (plan/cost_model.cpp: one step's prediction;
// plan/tp_shape.cpp: tensor parallelism's collectives and its shape): the rates a rank
// computes at, a pass's forward and backward seconds, the links' predictions, and the mesh
// groups of rank 0.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model/param_table.h"
#include "parallel/mesh.h"
#include "parallel/pp/schedule.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"

namespace pentad::cost {

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
  double weight = 0;  // of backward: the weight gradients (W of a split backward)
  void add_fwd_bwd(double seconds) {
    forward += seconds / 3;
    backward += 2 * seconds / 3;
  }
  // GEMMs: backward's second third is their weight gradient.
  void add_gemm(double seconds) {
    add_fwd_bwd(seconds);
    weight += seconds / 3;
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

inline std::vector<int> group_of(const parallel::MeshConfig& mesh, parallel::Axis axis) {
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
inline std::vector<int> tp2d_group(const parallel::MeshConfig& mesh, bool d1_group) {
  const parallel::TpPlace zero = parallel::tp_place(mesh, 0);
  std::vector<int> g;
  for (int t = 0; t < mesh.tp; ++t) {
    const parallel::TpPlace p = parallel::tp_place(mesh, t);
    if (d1_group ? p.j == zero.j : p.i == zero.i)
      g.push_back(parallel::mesh_rank(mesh, t, 0, 0, 0));
  }
  return g;
}

// The topology as the model sees the job: it prices the groups of world rank 0 (each axis)
// and the stages of its pipeline, so a slowed link (Topology::slowed) is moved to the pair
// holding the same places there: its ends' shared coordinates set to 0. A link between ranks
// that share no group stays where it is (no group the model prices holds it).
parallel::Topology fold_slow_links(const parallel::Topology& topo,
                                   const parallel::MeshConfig& mesh);

inline double element_bytes(const Config& cfg) {
  return placement(cfg).compute == DType::BF16 ? 2 : 4;
}

// One step's terms on one rank: the recipe's sizes, the machine's rates, the links between
// ranks, and the parameter table's GEMMs (model/param_table.h).
struct Step {
  const Config& cfg;
  const parallel::MeshConfig& mesh;
  const Machine& machine;
  int world, node_ranks, threads;
  double slow;
  Rates rates;
  Links links;
  double b, s, n, C, Ckv, F, V, e, tp, d2, d1;
  bool gpt2, sp;
  std::shared_ptr<const ParamTable> table;
  CutDegrees degrees;
  std::vector<LayerGemm> dense_gemms;
};

// Each pipeline stage's work per micro-batch, as the schedule simulator takes it, and the
// busiest stage's parts.
struct Stages {
  parallel::pp::SimCosts sim;
  std::vector<double> stage_bwd, stage_fwd, stage_work;  // a micro-batch's, every chunk
  std::vector<int> stage_layers;
  double compute_max = 0, tp_max = 0, cp_max = 0, ep_max = 0;
};

// Data parallelism's exposed seconds (plan/cost_data_parallel.cpp), and the ZeRO degree Z
// that divides the optimizer's work.
double dp_seconds(const Step& step, const MemoryEstimate& mem, const Stages& stages,
                  const parallel::pp::SimResult& run, double& Z);
// AdamW over a share of `share` values.
double optimizer_seconds(const Step& step, double share);

}  // namespace pentad::cost
