// The cost model's data-parallel part (plan/cost_model.h): the gradient reduction as the
// grad reducer overlaps it with backward, ZeRO's gathers, the tied embedding's sum, and the
// optimizer's step.
#include <algorithm>
#include <vector>

#include "plan/cost_parts.h"

namespace pentad::cost {
namespace {

// Between CPU nodes the reduction is pentad's ring over send/recv (ZeRO >= 1's
// reduce-scatter always, ZeRO 0's all-reduce by default: parallel/ring_all_reduce.cpp), and
// without a progress thread a ring moves a leg only when its rank polls it: backward polls
// kPollsPerLayer times a layer (Model::layer_backward), one leg of every bucket in flight
// each time. A layer's bucket, ready after its backward, has the polls of the layers after
// it; the legs left over run after backward, bucket after bucket, as does the whole of the
// embedding's, ready last.
double polled_ring(const Step& step, const Stages& stages, const std::vector<int>& dp_group,
                   CollectiveOp reduce, double grad_bytes, double bucket, double last) {
  const ParallelConfig& par = step.cfg.parallel;
  const Links& links = step.links;
  const std::vector<int>& stage_layers = stages.stage_layers;
  constexpr double kPollsPerLayer = 4;
  const double ranks = double(dp_group.size());
  const double legs = par.zero > 0 ? ranks - 1 : 2 * (ranks - 1);
  const int most = std::max(1, *std::max_element(stage_layers.begin(), stage_layers.end()));
  const double layer_bytes = std::max(0.0, grad_bytes - bucket) / most;
  const double one_layer = links.collective(reduce, dp_group, layer_bytes);
  double polled = last;
  for (int k = 0; k < most; ++k)
    polled += std::max(0.0, 1 - kPollsPerLayer * (most - 1 - k) / legs) * one_layer;
  return polled;
}

}  // namespace

// Data parallelism's exposed seconds, and the ZeRO degree Z that divides the optimizer's
// work.
double dp_seconds(const Step& step, const MemoryEstimate& mem, const Stages& stages,
                  const parallel::pp::SimResult& run, double& Z) {
  const ModelConfig& m = step.cfg.model;
  const ParallelConfig& par = step.cfg.parallel;
  const parallel::MeshConfig& mesh = step.mesh;
  const Machine& machine = step.machine;
  const Links& links = step.links;
  const double e = step.e;
  const double ga = double(step.cfg.train.grad_accum);
  const int p = mesh.pp;
  const std::vector<double>& stage_bwd = stages.stage_bwd;
  const std::vector<double>& stage_fwd = stages.stage_fwd;
  // Data parallelism over dp x cp: the fullest stage's fp32 gradients. Buckets reduce while
  // backward goes on (parallel/dp/grad_reducer.h): below stage 2 during the step's last
  // micro-batch's backward, at stage 2 and 3 during every one's; what outlasts backward, and
  // at least the last bucket, is waited for. ZeRO >= 1 all-gathers the updated values after
  // the optimizer; stage 3 gathers every unit before its forward and backward (prefetched).
  const double grad_bytes = 4 * mem.values;
  std::vector<int> dp_group;
  for (int c = 0; c < mesh.cp; ++c)
    for (int d = 0; d < mesh.dp; ++d) dp_group.push_back(parallel::mesh_rank(mesh, 0, c, d, 0));
  Z = par.zero > 0 ? double(dp_group.size()) : 1.0;
  double dp_exposed = 0;
  if (dp_group.size() > 1) {
    // The last bucket to finish is the first stage's first: the embedding, whose gradient is
    // final only at the very end of backward, and a bucket never splits a parameter, so it
    // holds the whole table (V C / tp, and GPT-2's positions) even beyond bucket_mb: the
    // parameter table's embedding rows on this rank.
    const double embedding = 4 * rank_values(step.table->embedding, step.degrees, 0).all;
    const double bucket =
        std::min(grad_bytes, std::max(double(par.bucket_mb) * 1024 * 1024, embedding));
    const CollectiveOp reduce =
        par.zero > 0 ? CollectiveOp::ReduceScatter : CollectiveOp::AllReduce;
    const double all = links.collective(reduce, dp_group, grad_bytes);
    const double last = links.collective(reduce, dp_group, bucket);
    const double window =
        links.overlaps(dp_group) ? *std::max_element(stage_bwd.begin(), stage_bwd.end()) : 0.0;
    double per_reduction = std::max(all - window, last);
    if (!machine.gpu && window > 0 && (par.zero > 0 || par.ring_all_reduce))
      per_reduction = std::max(
          per_reduction, polled_ring(step, stages, dp_group, reduce, grad_bytes, bucket, last));
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
      // Each pass gathers the units it reads: forward and backward, under the zero-bubble
      // schedules forward, B and W.
      const bool split = p > 1 && (par.pp_schedule == "zb-h1" || par.pp_schedule == "zb-v");
      const double gathers =
          (split ? 3 : 2) * ga * links.collective(CollectiveOp::AllGather, dp_group, grad_bytes);
      dp_exposed += std::max(0.0, gathers - (links.overlaps(dp_group) ? run.step_seconds : 0.0));
    }
  }
  if (p > 1 && m.tie_embeddings) {
    // Tied embeddings under pipelining: the first and last stages' tables (fp32 gradients,
    // each rank's ZeRO share) summed between the two after the reduction, waited for.
    const double table = 4 * rank_values(step.table->embedding.front(), step.degrees) / Z;
    dp_exposed += links.collective(CollectiveOp::AllReduce,
                                   {0, parallel::mesh_rank(mesh, 0, 0, 0, p - 1)}, table);
  }
  return dp_exposed;
}

double optimizer_seconds(const Step& step, double share) {
  const Machine& machine = step.machine;
  const ParallelConfig& par = step.cfg.parallel;
  double optimizer = 0;
  if (!machine.gpu) {
    optimizer = step.slow * share / step.rates.cpu.adamw_params_per_s;
  } else if (par.offload == "cpu") {  // on the host: gradients down, values up over PCIe
    optimizer = share * 28 / 50e9 + share * 8 / machine.host_link_Bps;
  } else {
    optimizer = share * 30 / (machine.memory_Bps * kMemoryEfficiency);
  }
  return optimizer;
}

}  // namespace pentad::cost
