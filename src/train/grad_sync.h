#pragma once
// How a step's gradients reach the optimizer over the data-parallel ranks, one class per
// ZeRO stage, so that the training step reads the same at every stage:
//   begin_step -> per micro-batch: begin_micro_batch, backward, after_backward -> finish.
// Stage 0: bucketed all-reduce of the step's summed gradients, overlapped with the last
// micro-batch's backward. Stage 1: the same buckets reduce-scattered once per step, each
// rank updating its shares, then all-gathering the parameters. Stage 2: every micro-batch
// reduce-scattered as backward finishes its buckets, added into the shares (no full
// gradient buffer lives across micro-batches). Stage 3: as 2, and the parameters live as
// shares, gathered unit by unit when used (train/parallelize.h's zero_parameters).
// Under pipelining the executor runs the micro-batches' passes chunk by chunk, so stages 2 and
// 3 reduce one chunk's gradients after each of its backward passes (or Ws): before_pass()
// narrows the reducers to the chunk's buckets and after_pass() finishes them; below stage 2
// the chunks report their gradients final in their last backward of the step.
// The reducers themselves (parallel/dp/grad_reducer.h) are the trainer's; this only drives
// them.
#include <cstdint>
#include <memory>

#include "core/params.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/dp/grad_reducer.h"

namespace pentad {

class GradSync {
 public:
  // The trainer's reducers: the dense parameters' over dp x cp and the MoE experts' over edp
  // (each null where there is none). With ZeRO, `shard` is the optimizer's shard over both and
  // `shares` the reduced gradients it reads (compact, shard.numel elements).
  struct Reducers {
    parallel::GradReducer* dense = nullptr;
    parallel::GradReducer* experts = nullptr;
  };
  static std::unique_ptr<GradSync> make(int zero_stage, ParamStore& params, Reducers reducers,
                                        const StateShard* shard, Tensor shares);
  // Whether every backward pass of a pipeline chunk reduces the chunk's gradients (stages 2
  // and 3), rather than only its last of the step.
  bool reduces_each_pass() const { return stage_ >= 2; }
  // Around a pipeline chunk's backward pass (or W) whose gradients are reduced now: the
  // chunk's parameters are arena elements [begin, end).
  void before_pass(int64_t begin, int64_t end);
  void after_pass();
  virtual ~GradSync() = default;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  int zero_stage() const { return stage_; }
  // Before the step's first micro-batch.
  virtual void begin_step() = 0;
  // Before micro-batch `micro` (of `count`) runs its backward: whether that backward reduces
  // its buckets as they become ready (ready()).
  virtual bool begin_micro_batch(int64_t micro, int64_t count) = 0;
  // After micro-batch `micro`'s backward.
  virtual void after_backward(int64_t micro, int64_t count) = 0;
  // After the last micro-batch: every reduction of the step started and waited for (under
  // pipelining at stages 2 and 3 after_pass() did that).
  void finish();
  // For Model::backward and the pipeline: the gradients from arena offset on are final
  // (empty without a reducer).
  GradsReady ready() const;
  // Sums parameter id's reduced gradients over `group` (the tied embedding's first and last
  // pipeline stages): whole at stage 0, with ZeRO this rank's shares (cut alike on both).
  virtual void sum_over(parallel::Communicator& group, int id) = 0;
  // Around a look at the whole reduced gradients (the first step's dump): ZeRO brings them
  // back from the shares, and drops them after.
  virtual void gather_grads() {}
  virtual void drop_gathered_grads() {}
  // After the optimizer updated this rank's shares: stages 1 and 2 all-gather the
  // parameters; stage 3 drops every unit gathered before the update (they are gathered
  // again, fresh, when next used).
  virtual void gather_updated_params() {}
  // ZeRO-3: every unit back to this rank's shares only, as a load leaves them (a restored
  // snapshot); nothing at the other stages, where every rank holds the parameters whole.
  virtual void release_params() {}

 protected:
  GradSync(int stage, ParamStore& params, Reducers reducers)
      : stage_(stage), params_(params), reducers_(reducers) {}
  const int stage_;
  ParamStore& params_;
  const Reducers reducers_;
  bool in_pass_ = false;     // between before_pass() and after_pass()
  bool passes_run_ = false;  // this step's reductions ran in passes
};

}  // namespace pentad
