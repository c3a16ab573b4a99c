#include "train/grad_sync.h"

#include "core/check.h"

namespace pentad {

namespace {

// Stage 0: the micro-batches' gradients add up in the arena; the last micro-batch's backward
// starts each bucket's all-reduce as soon as it is final.
class AllReduceSync final : public GradSync {
 public:
  AllReduceSync(ParamStore& params, Reducers reducers) : GradSync(0, params, reducers) {}
  void begin_step() override { params_.zero_grads(); }
  bool begin_micro_batch(int64_t micro, int64_t count) override { return micro + 1 == count; }
  void after_backward(int64_t, int64_t) override {}
  void sum_over(parallel::Communicator& group, int id) override {
    group.all_reduce(params_.grad(id));
  }
};

// Stages 1 to 3: each rank keeps the reduced gradients of its shares only (the optimizer's
// shard).
class ShardedSync : public GradSync {
 public:
  ShardedSync(int stage, ParamStore& params, Reducers reducers, const StateShard& shard,
              Tensor shares)
      : GradSync(stage, params, reducers), shard_(shard), shares_(shares) {}
  void sum_over(parallel::Communicator& group, int id) override {
    for (const StateShard::Piece& piece : shard_.pieces(params_.spec(id)))
      group.all_reduce(
          view_of(shares_.f32() + piece.shard, Shape{piece.count}, DType::F32, params_.device()));
  }
  void gather_grads() override {
    reducers_.dense->gather_grads();
    if (reducers_.experts) reducers_.experts->gather_grads();
  }
  void drop_gathered_grads() override {
    reducers_.dense->drop_gathered_grads();
    if (reducers_.experts) reducers_.experts->drop_gathered_grads();
  }

 protected:
  void all_gather_params() {
    reducers_.dense->gather_params();
    if (reducers_.experts && !bug_injected("zero-moe-skip-expert-gather"))  // planted for the
      reducers_.experts->gather_params();                                   // layout test
  }

 private:
  const StateShard& shard_;
  const Tensor shares_;
};

// Stage 1: reduced (scattered) once per step, like stage 0; the update all-gathered.
class ShardedStateSync final : public ShardedSync {
 public:
  using ShardedSync::ShardedSync;
  void begin_step() override { params_.zero_grads(); }
  bool begin_micro_batch(int64_t micro, int64_t count) override { return micro + 1 == count; }
  void after_backward(int64_t, int64_t) override {}
  void gather_updated_params() override { all_gather_params(); }
};

// Stages 2 and 3: every micro-batch's backward reduce-scatters each bucket as it is final and
// drops the bucket's full gradients; micro-batches after the first add into the shares (each
// bucket starts from zeros itself, so the arena is not cleared).
class AccumulatingSync : public ShardedSync {
 public:
  using ShardedSync::ShardedSync;
  void begin_step() override {
    passes_run_ = false;
    for (parallel::GradReducer* r : {reducers_.dense, reducers_.experts})
      if (r) r->begin_step();
  }
  bool begin_micro_batch(int64_t, int64_t) override { return true; }
  void after_backward(int64_t micro, int64_t count) override {
    if (micro + 1 == count) return;  // the last one's reductions: finish()
    for (parallel::GradReducer* r : {reducers_.dense, reducers_.experts})
      if (r) r->finish();
  }
};

// Stage 2: the update all-gathered, as at stage 1.
class ShardedGradSync final : public AccumulatingSync {
 public:
  ShardedGradSync(ParamStore& params, Reducers reducers, const StateShard& shard, Tensor shares)
      : AccumulatingSync(2, params, reducers, shard, shares) {}
  void gather_updated_params() override { all_gather_params(); }
};

// Stage 3: the units gather the parameters when next used; any gathered (or prefetched)
// before the update holds old values of the other ranks' shares, so back to this rank's
// shares only.
class ShardedParamSync final : public AccumulatingSync {
 public:
  ShardedParamSync(ParamStore& params, Reducers reducers, const StateShard& shard, Tensor shares)
      : AccumulatingSync(3, params, reducers, shard, shares) {}
  void gather_updated_params() override {
    if (!bug_injected("zero3-keep-stale"))  // planted for the layout test
      reducers_.dense->release_all();
    if (reducers_.experts && !bug_injected("zero3-moe-stale-experts"))  // planted for the
      reducers_.experts->release_all();                                 // layout test
  }
  void release_params() override {
    reducers_.dense->release_all();
    if (reducers_.experts) reducers_.experts->release_all();
  }
};

}  // namespace

std::unique_ptr<GradSync> GradSync::make(int zero_stage, ParamStore& params, Reducers reducers,
                                         const StateShard* shard, Tensor shares) {
  if (zero_stage == 0) return std::make_unique<AllReduceSync>(params, reducers);
  PENTAD_CHECK(reducers.dense && shard, "ZeRO-{} without a dense reducer and a shard", zero_stage);
  if (zero_stage == 1)
    return std::make_unique<ShardedStateSync>(1, params, reducers, *shard, shares);
  if (zero_stage == 2) return std::make_unique<ShardedGradSync>(params, reducers, *shard, shares);
  return std::make_unique<ShardedParamSync>(params, reducers, *shard, shares);
}

void GradSync::finish() {
  PENTAD_CHECK(!in_pass_, "GradSync::finish inside a pass");
  if (passes_run_) return;  // every chunk's buckets reduced after its passes
  for (parallel::GradReducer* r : {reducers_.dense, reducers_.experts})
    if (r) r->finish();
}

void GradSync::before_pass(int64_t begin, int64_t end) {
  PENTAD_CHECK(reduces_each_pass() && !in_pass_, "GradSync::before_pass at ZeRO-{}{}", stage_,
               in_pass_ ? ", inside a pass" : "");
  in_pass_ = passes_run_ = true;
  for (parallel::GradReducer* r : {reducers_.dense, reducers_.experts})
    if (r) r->set_window(begin, end);
}

void GradSync::after_pass() {
  PENTAD_CHECK(in_pass_, "GradSync::after_pass without before_pass");
  in_pass_ = false;
  for (parallel::GradReducer* r : {reducers_.dense, reducers_.experts})
    if (r) {
      r->finish();
      r->clear_window();
    }
}

GradsReady GradSync::ready() const {
  if (!reducers_.dense && !reducers_.experts) return {};
  return [dense = reducers_.dense, experts = reducers_.experts](int64_t offset) {
    if (dense) dense->ready_from(offset);
    if (experts) experts->ready_from(offset);
  };
}

}  // namespace pentad
