#pragma once
// The [parallel] section of a recipe: the device mesh, pipeline schedule and gradient
// buckets.
#include <cstdint>
#include <string>

namespace pentad {

struct ParallelConfig {  // [parallel]: the device mesh (see parallel/mesh.h)
  int64_t tp = 1;        // tensor parallel (Megatron column/row) degree
  // 2D tensor parallelism (parallel/tp/tensor_parallel.h): the tp ranks as a d1 x d2 mesh,
  // "d1xd2" with d1 * d2 = tp; empty: "tpx1" (Megatron's 1D form); "auto": chosen from
  // `topology` by the cost model. tp_order: "row" (a mesh row, the d2 ranks sharing d1's
  // index, is adjacent ranks) or "column" (a mesh column is). tp_chunks: each 2D layer's
  // collectives split in this many row pieces, pipelined with the GEMMs of the next piece.
  std::string tp_shape;
  std::string tp_order = "row";
  int64_t tp_chunks = 1;
  std::string topology;  // a `pentad probe` file: tp_shape = "auto" and the planner read it
  int64_t dp = 0;        // data parallel degree; 0 = world size / (tp * cp * pp)
  int64_t cp = 1;        // context parallel degree (parallel/cp/context_parallel.h)
  // How attention spans the cp ranks: "ulysses" (all-to-all of heads), "ring" (K/V blocks
  // around a ring, zig-zag balanced) or "hybrid" (Ulysses over cp_ulysses adjacent ranks,
  // ring over cp / cp_ulysses).
  std::string cp_impl = "ring";
  int64_t cp_ulysses = 0;  // hybrid only: the Ulysses degree
  int64_t pp = 1;          // pipeline degree (stages)
  // MoE layers (MoE Parallel Folding, parallel/mesh.h): experts split over ep ranks, each
  // expert's width over etp ranks, on the same ranks as the dense layers' tp x cp x dp;
  // ep x etp must divide dp x cp x tp.
  int64_t ep = 1;
  int64_t etp = 1;
  // Pipeline schedule (parallel/pp/schedule.h) over train.grad_accum micro-batches:
  // "gpipe" | "1f1b" | "kfkb" (groups of pp_group micro-batches) | "interleaved"
  // (virtual_stages model chunks per stage) | "adaptive" (kfkb re-choosing its group every
  // pp_adapt_every steps from measured compute and link times, within pp_memory_mb of
  // activations per stage; 0 = no limit).
  std::string pp_schedule = "1f1b";
  int64_t virtual_stages = 1;
  int64_t pp_group = 2;
  std::string pp_layout;  // layers per model chunk, e.g. "3,5"; empty = even split
  float pp_memory_mb = 0.0f;
  int64_t pp_adapt_every = 10;
  // Simulated slow stage-to-stage links, for benchmarks and tests: every pipeline send is
  // delivered this many milliseconds late (the sender does not wait).
  float pp_link_delay_ms = 0.0f;
  // Data-parallel gradient all-reduces (ZeRO stage 0, f32 host memory) as pentad's ring over
  // send/recv, whose legs are timed per peer for the fault monitor's link matrix, with at
  // most two 4 MiB slices of scratch a rank (parallel/ring_all_reduce.cpp); false: MPI's own
  // all-reduce, which names no peer and whose tree holds scratch copies on its inner ranks.
  bool ring_all_reduce = true;
  // Communicator backend (parallel/backend_choice.h): "auto" (CPU: MPI; CUDA: NCCL, or the
  // staged backend where two ranks share a GPU or NCCL is not built), "nccl", or "staged"
  // (collectives through host memory; on the CPU, host tensors through its staging).
  std::string comm_backend = "auto";
  bool sequence_parallel = false;     // shard norm/residual regions along the sequence over tp
  std::string order = "tp,cp,dp,pp";  // mesh axes, innermost (fastest links) first
  float bucket_mb = 4.0f;             // data-parallel gradient bucket size, MiB
  // ZeRO over the dp x cp group (parallel/dp/grad_reducer.h): 0 none; 1 AdamW state
  // sharded, gradients reduce-scattered, parameters all-gathered after the update; 2 also
  // the full-size gradients dropped bucket by bucket as they are reduced.
  int64_t zero = 0;
  // ZeRO-3: the most units (a layer, the embedding, the head) each reducer holds gathered at
  // once. 2: the unit computing and the next one prefetched; 1: no prefetch (each gather
  // waited for where the unit is needed); a stretch that reads more units gathers them all.
  int64_t zero_live_units = 2;
  // Where AdamW's state lives: "none" (beside the parameters), "cpu" (host memory, the update
  // on the host: what a CPU run does anyway), "nvme" (a file under offload_path, streamed
  // through host buffers sub-group by sub-group with io_uring and O_DIRECT: optim/nvme_state.h;
  // requests of nvme_block_kb, nvme_queue_depth in flight, nvme_subgroup_kb per tensor per step).
  std::string offload = "none";
  std::string offload_path;
  int64_t nvme_block_kb = 1024;
  int64_t nvme_queue_depth = 32;  // measured defaults: bench/RESULTS.md, NVMe offload engine
  int64_t nvme_subgroup_kb = 16384;
  // With offload = "nvme" and zero = 3: this rank's parameter shares live in the file too (a
  // third tensor beside m and v, ZeRO-Infinity's parameter offload), read back a layer at a
  // time before its all-gather; false keeps them in memory.
  bool offload_params = true;
};

}  // namespace pentad
