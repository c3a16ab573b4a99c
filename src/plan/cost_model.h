#pragma once
// The planner's cost model (docs/plan.md): the predicted step time of a recipe on a layout,
// from what each rank computes (a kernel table measured on this CPU, plan/calibration.h,
// or a GPU's datasheet peak with an efficiency per kernel shape) and what it sends (a
// topology, parallel/topology.h: measured by `pentad probe` or a cluster preset's links).
// FLOPs are counted as the model counts them (layer_flops_per_token, model/model.h).
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "parallel/topology.h"
#include "plan/calibration.h"
#include "recipe/config.h"

namespace pentad {

// The trainer whose step is predicted: what it overlaps and what it sends. pentad's own (the
// default) is what pentad implements. Megatron-Core's (`--engine megatron-core`, GPU
// clusters) is there to compare with its published figures: its distributed optimizer
// all-gathers the bf16 model parameters (not fp32), bucket by bucket behind the next step's
// first forward (--overlap-param-gather), and with sequence parallelism its 1D tp gathers and
// scatters are pipelined with the GEMMs they feed or follow (--tp-comm-overlap).
struct Engine {
  std::string name = "pentad";
  bool param_gather_in_compute_type = false;  // ZeRO >= 1: the gather's bytes per value
  bool param_gather_overlapped = false;       // behind the next step's first forward
  bool tp_comm_overlapped = false;            // 1D tp with sp: pipelined with the GEMMs
};
// "pentad" or "megatron-core"; pentad::Error naming --engine otherwise.
Engine engine_named(const std::string& name);

// What computes, per rank.
struct Machine {
  std::string name;
  bool gpu = false;
  int ranks_per_node = 1;
  double memory_bytes = 0;  // per rank: a GPU's memory, or a CPU node's over its ranks
  // A GPU, from its datasheet: dense peak of the compute type and memory bandwidth.
  double peak_flops = 0, memory_Bps = 0;
  double host_link_Bps = 0;  // PCIe to the host (parallel.offload = "cpu")
  // A CPU node: its cores and the measured kernel table.
  int cores = 1;
  Calibration calibration;
  Engine engine;
  // Peak FLOP/s of one rank, what MFU is against: a GPU's datasheet peak, or a CPU node's
  // fastest measured GEMM rate (every core) over its ranks.
  double rank_peak_flops() const;
};

// A named cluster (`--cluster dgx-h100[:NODES]`) as a machine and its links. NODES: as
// given, else the fewest nodes holding `ranks`. pentad::Error naming --cluster if unknown.
struct Cluster {
  Machine machine;
  parallel::Topology topology;
};
Cluster cluster_preset(const std::string& spec, int ranks);
// This CPU machine with `ranks` ranks on it, its links from the calibrated copy rate.
Cluster this_machine(const Calibration& calibration, int ranks);

// One collective a layer needs, per micro-batch: over `group` (world ranks), `bytes` per
// rank as Topology::collective_seconds takes them; `hidden`: the fraction of it overlapped
// with compute (2D tp chunks).
struct CollectiveCall {
  parallel::CollectiveOp op = parallel::CollectiveOp::AllReduce;
  std::vector<int> group;
  double bytes = 0;
  double hidden = 0;
  std::string what;  // "tp d2 qkv", ...
};
// Tensor parallelism's collectives of one dense layer and micro-batch, forward then backward
// (1D Megatron with or without sequence parallelism; 2D as parallel/tp/tensor_parallel.h),
// for the tp group of world rank 0.
std::vector<CollectiveCall> tp_layer_collectives(const Config& cfg,
                                                 const parallel::MeshConfig& mesh, bool backward);

// Model FLOPs of one token through a training step (forward and backward; recomputation not
// counted), as the model counts them (head_flops_per_token, layer_flops_per_token at `keys`,
// the sequence length): what `pentad plan`'s MFU and the training step line count.
double model_flops_per_token(const ModelConfig& m, double keys);

// Dense bf16 peak FLOP/s of a GPU from its name as CUDA reports it ("NVIDIA H100 80GB HBM3"),
// by datasheet; 0 where the name is not in the table.
double gpu_peak_flops(const std::string& device_name);

// parallel.tp_shape = "auto": of every shape d1 x d2 of mesh.tp (1D tp x 1 among them) that
// divides the model (and both orders where d1, d2 > 1), the one whose tp collectives of one
// layer (forward and backward, tp_layer_collectives, chunks' overlap counted) take least time
// over `topology`. Where none divides it, throws pentad::Error stating the 1D and the 2D rule
// and why each shape fails.
struct TpShapeChoice {
  int d2 = 1;
  bool column_first = false;
  double seconds = 0, one_d_seconds = 0;
  std::string describe(int tp) const;  // "2x4 row"
  std::string candidates;              // every shape tried with its time: "8x1 1.2 ms, ..."
};
TpShapeChoice choose_tp_shape(const Config& cfg, parallel::MeshConfig mesh,
                              const parallel::Topology& topology);

struct Prediction {
  double step_seconds = 0;
  double tokens_per_second = 0;
  double flops_per_device = 0;  // model FLOP/s per rank, counted as the model counts them
  double mfu = 0;               // flops_per_device / Machine::rank_peak_flops
  double memory_bytes = 0;      // the memory plan's total on the fullest rank
  // The parts of the step (seconds): compute of the busiest stage through the schedule (on
  // oversubscribed CPU cores, of the node's mean stage: its stages share the cores),
  // tp/cp/ep collectives not hidden, the pipeline's bubble, the data-parallel reduction left
  // after backward, the optimizer. `oversubscription`: ranks' threads per core on a CPU
  // node (every part above is already stretched by it), 1 otherwise.
  double compute = 0, tp = 0, cp = 0, ep = 0, bubble = 0, dp = 0, optimizer = 0;
  double oversubscription = 1;
};

// Predicts one optimizer step of `cfg` on `mesh` (valid: mesh_config accepted it).
Prediction predict_step(const Config& cfg, const parallel::MeshConfig& mesh, const Machine& machine,
                        const parallel::Topology& topology);

}  // namespace pentad
