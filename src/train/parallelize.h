#pragma once
// The parallelize step (as torchtitan's parallelize functions): builds this rank's share of
// the model, which is written for one device (model/model.h), and connects it to the mesh.
// Parallelisms are applied in a fixed order:
//   1. tensor parallelism: the model is cut by the hooks of model/sharding.h, implemented
//      here by parallel/tp's f and g over the mesh's tp group;
//   2. expert parallelism: an MoE block's dispatch and combine become parallel/ep's
//      all-to-alls over the mesh's ep and etp groups; context parallelism's attention
//      becomes parallel/cp's Ulysses all-to-alls and ring over the cp group;
//   3. pipeline parallelism: the model holds this stage's layer ranges (parallel/pp/layout.h)
//      and a Stage adapter (parallel/pp/stage.h) lets the pipeline executor drive them;
//   4. data parallelism reduces the gradients the model produces (parallel/dp, in the trainer),
//      and ZeRO-3 gathers the parameters it reads (zero_parameters below).
#include <memory>
#include <vector>

#include "model/model.h"
#include "parallel/dp/grad_reducer.h"
#include "parallel/mesh.h"
#include "parallel/pp/stage.h"
#include "recipe/config.h"

namespace pentad {

// What connects one rank's model to the mesh; must outlive the model and its pipeline.
struct ModelWiring {
  std::unique_ptr<TensorParallelHooks> tp;     // null: tp = 1 (the model's no-op hooks)
  std::unique_ptr<ExpertParallelHooks> ep;     // null: every expert local
  std::unique_ptr<ContextParallelHooks> cp;    // null: cp = 1, the whole sequence here
  std::unique_ptr<parallel::pp::Stage> stage;  // pp > 1: the model's chunks, for the pipeline
};

// cfg.model at train.micro_batch x train.seq_len, cut for this rank's tp and pp coordinates
// of `mesh` (null: one device, the whole model), its parameters not yet initialized.
// Fills `wiring`.
std::unique_ptr<Model> parallelize(const Config& cfg, parallel::Mesh* mesh, Placement placement,
                                   ModelWiring& wiring);

// ZeRO-3 (parameters sharded over dp x cp, MoE experts over edp): the model's parameter
// hooks, which gather each stretch's units through the reducers' buckets before it and drop
// them after, each reducer holding at most `live_units` units whole at once (besides what a
// stretch itself reads: parallel.zero_live_units). A parameter belongs to the first reducer
// that buckets it. The reducers and the store outlive the hooks.
std::unique_ptr<ParameterHooks> zero_parameters(std::vector<parallel::GradReducer*> reducers,
                                                const ParamStore& params, int live_units);

// ZeRO-3: the most parameter values the hooks of zero_parameters() hold whole at once
// through one forward and backward over `stretches` (Model::stretches()), counted by
// following the same calls: each stretch's units and the next ones prefetched as far as
// `live_units` allows. `others`
// leaves out this rank's shares, resident anyway unless they are kept on NVMe.
struct GatheredPeak {
  int64_t whole = 0, others = 0;  // values
};
GatheredPeak zero3_gathered_peak(std::vector<parallel::GradReducer*> reducers,
                                 const ParamStore& params,
                                 const std::vector<std::vector<int>>& stretches, int live_units);

// The model's chunks as a pipeline stage sees them; the model outlives it.
std::unique_ptr<parallel::pp::Stage> pipeline_stage(Model& model);

}  // namespace pentad
