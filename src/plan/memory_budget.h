#pragma once
// What a run will need on each rank, worked out from the recipe alone (nothing allocated,
// no loop over parameters), and what the machine it runs on can give. The trainer's printed
// memory plan (Trainer::memory_plan) measures the real arenas afterwards; this estimate
// lets a recipe that asks for terabytes fail in milliseconds, naming the keys to change.
#include <string>
#include <vector>

#include "model/param_table.h"
#include "parallel/mesh.h"
#include "recipe/config.h"

namespace pentad {

// Bytes on the rank that needs the most: the largest pipeline stage of any tp rank.
struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0;  // bytes
  // Checkpoint snapshots (when train.save_every > 0): the second set of parameters and
  // AdamW moments (checkpoint.snapshot swap) or the host staging buffer (copy), alike in size.
  double snapshot = 0;
  // Of those (on the CPU; on CUDA in `host`), the in-memory checkpoint level's two slots
  // (checkpoint.memory_every).
  double memory_level = 0;
  double values = 0;  // parameter values held by that rank
  // Of those, the routed experts' (n_experts / ep experts per MoE layer, each 1/etp of its
  // width); and of activations, the MoE layers' dispatch buffers: the routed token rows sent
  // and received, and the expert activations of the rows received (worst case, dropless).
  double expert_values = 0;
  double dispatch = 0;  // bytes
  int stage = 0;        // its pipeline stage
  // CUDA: the host memory taken beside the device's total(): with AdamW offloaded
  // (parallel.offload "cpu" or "nvme") m and v (or the NVMe sub-groups), the page-locked
  // staging and, with ZeRO-3's parameter shares on NVMe, their upload slots; the in-memory
  // checkpoint level's slots. 0 otherwise.
  double host = 0;  // bytes
  double total() const { return parameters + gradients + optimizer + activations + snapshot; }
};

// The model's tables of parameters and activations (model/param_table.h,
// model/activations.h) summed over this rank's cuts, and the schedule's micro-batches in
// flight. Arena alignment is left out, so it is a little below the measured plan.
MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh);
// The same for the parameters of `table` (model/param_table.h: param_table(cfg.model), or
// one a test extends).
MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh,
                               const ParamTable& table);
// ZeRO-3 (the hooks of train/parallelize.cpp): one stretch's values in the dense reducer's
// units and in the experts'.
struct ZeroStretch {
  double dense = 0, experts = 0;
};
// The bytes of ZeRO-3's shares a rank's parameter arena backs. The arena reserves the whole
// model's addresses and backs each share in whole granules of `granule` bytes
// (Arena::reserved: the host's pages, CUDA's 2 MiB), so a share smaller than a granule
// costs a whole one, and shares of neighbouring small units share one. The stretches lie in
// the arena in order (the dense values, then the experts'), each cut into Z shares (its
// experts into edp) of `value_bytes` a value; the figure is the rank that backs the most.
double zero3_backed_shares(const std::vector<ZeroStretch>& stretches, double Z, double edp,
                           double value_bytes, double granule);
// The whole model's parameter count, whatever cfg.parallel says (under pp and ep a rank
// holds a part): the closed form on one rank.
int64_t model_parameters(const Config& cfg);
// The same for the ranks of one pipeline stage.
MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh, int stage);
// Per pipeline stage, the activation bytes each micro-batch in flight takes there: its slot
// of every chunk the stage holds (with a split backward's kept gradients). From the recipe
// and the mesh alone, so every rank gets the same (zb-h1's held limits, plan/layout.h).
std::vector<double> stage_slot_bytes(const Config& cfg, const parallel::MeshConfig& mesh);
// Per stage, what the head's buffers (the scratch of the stage holding the head) take beyond
// the backward's layer gradients they lie over (model/activations.h): 0 on every other
// stage, and often there too. The same whatever the micro-batches in flight.
std::vector<double> stage_head_bytes(const Config& cfg, const parallel::MeshConfig& mesh);

// The ranks on this machine and what they share. Collective over MPI_COMM_WORLD (one rank
// alone when MPI is not initialised).
struct NodeShare {
  int ranks = 1;       // ranks on this machine
  int local_rank = 0;  // this rank's place among them
  int cores = 1;       // distinct cores in the union of their affinity masks
  int threads = 1;     // compute threads of those ranks together
  // Physical memory, or the job's cgroup limit when that is lower (core/cgroup.h), and
  // which of them it is: "the machine's physical memory", "cgroup /slurm/job_42 (memory.max)".
  double memory_bytes = 0;
  std::string memory_source;
  // The cgroup's soft bound (memory.high), above which the kernel throttles; 0: none.
  double memory_high = 0;
  std::string memory_high_source;
  // This rank's CUDA device (after launch::start_rank chose it): its memory, and the ranks
  // of this machine on it (local rank modulo the devices, as start_rank assigns them).
  // 0 and 1 without a device.
  double device_bytes = 0;
  int device_ranks = 1;
};
NodeShare node_share();

// The estimate as a few lines for `pentad plan`: the mesh, each item, the total.
std::string describe_memory(const Config& cfg, const parallel::MeshConfig& mesh);

// Throws pentad::Error when the estimate is above train.memory_limit_mb, or, when that key
// is 0, above this rank's share of the memory its machine and its cgroup allow (memory /
// ranks on the machine; CPU only: on CUDA the device allocator reports what does not fit).
// The message names that memory and where its size came from, lists the items from the
// largest and the values of model.n_layer, model.d_model, train.micro_batch and the
// parallel degrees that would fit. When the plan fits, the first rank of each machine logs
// that memory (CPU only), and warns when the plan is above its share of memory.high.
void check_memory(const Config& cfg, const parallel::MeshConfig& mesh, const NodeShare& node);

// model.recompute = "auto": decides cfg.model.recompute.on from the estimate without it
// against the limit check_memory applies (train.memory_limit_mb, else this rank's share of
// its machine's memory; on CUDA of its device's): on only where that does not fit. Returns
// a line saying what it chose and why (empty when the recipe did not say "auto").
// Collective over MPI_COMM_WORLD when MPI is initialised: on for every rank where any
// rank's plan does not fit.
std::string resolve_recompute(Config& cfg, const parallel::MeshConfig& mesh, const NodeShare& node);

// "10.0 GiB from cgroup /slurm/job_42 (memory.max), 2 ranks share it".
std::string describe_node_memory(const NodeShare& node);

}  // namespace pentad
