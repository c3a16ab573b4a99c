#include "train/parallelize.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/check.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/ep/expert_parallel.h"
#include "parallel/pp/layout.h"
#include "parallel/tp/tensor_parallel.h"
#include "plan/layout.h"

namespace pentad {

namespace {

// The model's tensor-parallel hooks run Megatron's operators over the tp group.
class MeshTensorParallel final : public TensorParallelHooks {
 public:
  MeshTensorParallel(parallel::Communicator& group, bool sequence_parallel)
      : tp_(&group, sequence_parallel) {}
  MeshTensorParallel(parallel::Mesh& mesh, bool sequence_parallel, int chunks)
      : tp_(mesh.tp_all(), mesh.tp_heads(), mesh.tp_hidden(), sequence_parallel), chunks_(chunks) {}
  int degree() const override { return tp_.degree(); }
  int rank() const override { return tp_.rank(); }
  bool sequence_parallel() const override { return tp_.sequence_parallel(); }
  void f_forward(Tensor full, const Tensor& local) override { tp_.f_forward(full, local); }
  void f_backward(Tensor local, Tensor full) override { tp_.f_backward(local, full); }
  void g_forward(Tensor local, Tensor full) override { tp_.g_forward(local, full); }
  void g_backward(Tensor full, const Tensor& local) override { tp_.g_backward(full, local); }
  int heads_degree() const override { return tp_.heads_degree(); }
  int heads_rank() const override { return tp_.heads_rank(); }
  int hidden_degree() const override { return tp_.hidden_degree(); }
  int hidden_rank() const override { return tp_.hidden_rank(); }
  void gather_hidden(Tensor full_j, const Tensor& local) override {
    tp_.gather_hidden(full_j, local);
  }
  void reduce_hidden(Tensor local, Tensor partial_j) override {
    tp_.reduce_hidden(local, partial_j);
  }
  void all_reduce_hidden(Tensor buf) override { tp_.all_reduce_hidden(buf); }
  int chunks() const override { return chunks_; }
  void begin_hidden_sum(Tensor buf) override { tp_.all_reduce_hidden(buf, /*async=*/true); }
  void end_hidden_sums() override { tp_.wait_hidden(); }
  void sum(Tensor buf) override { tp_.all_reduce(buf, parallel::ReduceOp::Sum); }
  void max(Tensor buf) override { tp_.all_reduce(buf, parallel::ReduceOp::Max); }

 private:
  parallel::TensorParallel tp_;
  int chunks_ = 1;
};

// An MoE block's dispatch and combine run parallel/ep's all-to-alls over the ep and etp
// groups (MoE Parallel Folding: the same ranks as the dense layers, re-split).
class MeshExpertParallel final : public ExpertParallelHooks {
 public:
  MeshExpertParallel(parallel::Communicator& ep, parallel::Communicator& etp, int64_t experts)
      : ep_group_(ep), etp_group_(etp), ep_(ep, etp, experts) {}
  int ep_degree() const override { return ep_group_.size(); }
  int ep_rank() const override { return ep_group_.rank(); }
  int etp_degree() const override { return etp_group_.size(); }
  int etp_rank() const override { return etp_group_.rank(); }
  // The host waits here for every peer's counts (an MPI exchange, on CUDA too): it sizes the
  // received rows' buffers from them. The rows themselves then move without a host wait.
  void reserve(double received, int64_t C, Device device, DType dtype) override {
    ep_.reserve(received, C, device, dtype);
  }
  void plan(ExpertRoute& route) override {
    route.recv = ep_.exchange_counts(route.send);
    route.rows = ep_.expert_rows(route.recv);
    route.recv_rows = std::accumulate(route.rows.begin(), route.rows.end(), int64_t{0});
  }
  void dispatch(const ExpertRoute& route, const Tensor& in, Tensor out) override {
    ep_.dispatch(route.send, route.recv, in, out);
  }
  void combine(const ExpertRoute& route, const Tensor& in, Tensor out) override {
    ep_.combine(route.send, route.recv, in, out);
  }

 private:
  parallel::Communicator& ep_group_;
  parallel::Communicator& etp_group_;
  parallel::ExpertParallel ep_;
};

// Attention across the cp ranks (parallel/cp): Ulysses, ring or both.
class MeshContextParallel final : public ContextParallelHooks {
 public:
  MeshContextParallel(parallel::Mesh& mesh, const parallel::ContextShape& shape, DType dtype,
                      Device device)
      : group_(mesh.group(parallel::Axis::CP)),
        cp_(mesh.cp_ulysses(), mesh.cp_ring(), shape, dtype, device) {}
  int degree() const override { return cp_.degree(); }
  Tensor positions() const override { return cp_.positions_tensor(); }
  size_t scratch_bytes() const override { return cp_.scratch_bytes(); }
  int rank() const override { return group_.rank(); }
  std::vector<int32_t> host_positions() const override { return cp_.positions(); }
  void sum(Tensor buf) override { group_.all_reduce(buf); }
  void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                         const Tensor& v) override {
    cp_.forward(out, lse, q, k, v);
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse) override {
    cp_.backward(dq, dk, dv, dout, q, k, v, out, lse);
  }

 private:
  parallel::Communicator& group_;
  parallel::ContextParallel cp_;
};

// The pipeline's stage callbacks on the model's chunks and activation slots.
class ModelStage final : public parallel::pp::Stage {
 public:
  explicit ModelStage(Model& model) : model_(model) {}
  int chunks() const override { return model_.chunks(); }
  Shape boundary_shape() const override { return Shape{model_.rows(), model_.config().d_model}; }
  int slots(int chunk) const override { return model_.slots_made(chunk); }
  int add_slot(int chunk) override { return model_.add_slot(chunk); }
  Tensor input(int chunk, int slot) override { return model_.chunk_input(chunk, slot); }
  Tensor output(int chunk, int slot) override { return model_.chunk_output(chunk, slot); }
  float forward(int chunk, int slot, const int32_t* tokens, const int32_t* targets,
                float dloss) override {
    return model_.forward_chunk(chunk, slot, tokens, targets, dloss);
  }
  void backward(int chunk, int slot, const Tensor& d_output, bool last_micro_batch,
                const parallel::pp::GradsReady& on_ready) override {
    model_.backward_chunk(chunk, slot, d_output, last_micro_batch, on_ready);
  }
  void backward_input(int chunk, int slot, const Tensor& d_output) override {
    model_.backward_chunk_input(chunk, slot, d_output);
  }
  void backward_weights(int chunk, int slot, bool last_micro_batch,
                        const parallel::pp::GradsReady& on_ready) override {
    model_.backward_chunk_weights(chunk, slot, last_micro_batch, on_ready);
  }
  Tensor input_grad() override { return model_.input_grad(); }
  void set_progress(std::function<void()> progress) override {
    model_.set_progress(std::move(progress));
  }

 private:
  Model& model_;
};

}  // namespace

std::unique_ptr<Model> parallelize(const Config& cfg, parallel::Mesh* mesh, Placement placement,
                                   ModelWiring& wiring) {
  Sharding sharding;
  std::vector<LayerRange> layout;  // empty: the whole model
  if (mesh) {
    parallel::Communicator& tp_group = mesh->group(parallel::Axis::TP);
    if (tp_group.size() > 1) {
      wiring.tp =
          mesh->tp_hidden()
              ? std::make_unique<MeshTensorParallel>(*mesh, cfg.parallel.sequence_parallel,
                                                     int(cfg.parallel.tp_chunks))
              : std::make_unique<MeshTensorParallel>(tp_group, cfg.parallel.sequence_parallel);
      sharding.tp = wiring.tp.get();
    }
    if (cfg.model.is_moe() &&
        (mesh->degree(parallel::Axis::EP) > 1 || mesh->degree(parallel::Axis::ETP) > 1)) {
      wiring.ep = std::make_unique<MeshExpertParallel>(
          mesh->group(parallel::Axis::EP), mesh->group(parallel::Axis::ETP), cfg.model.n_experts);
      sharding.ep = wiring.ep.get();
    }
    const int cp = mesh->degree(parallel::Axis::CP);
    if (cp > 1) {
      const int64_t p = tp_group.size() / mesh->config().tp_d2;  // heads split over d1
      const parallel::ContextShape shape{cfg.train.micro_batch, cfg.train.seq_len,
                                         cfg.model.n_head / p, cfg.model.kv_heads() / p,
                                         cfg.model.head_dim()};
      wiring.cp =
          std::make_unique<MeshContextParallel>(*mesh, shape, placement.compute, placement.device);
      sharding.cp = wiring.cp.get();
    }
    const int stages = mesh->degree(parallel::Axis::PP);
    if (stages > 1) {
      const std::vector<int64_t> layers = pipeline_chunk_layers(cfg, stages);
      for (const parallel::pp::Chunk& c : parallel::pp::stage_chunks(
               layers, stages, mesh->coord(parallel::Axis::PP), cfg.parallel.pp_schedule == "zb-v"))
        layout.push_back({c.layer_begin, c.layer_end, c.first, c.last});
    }
  }
  const int64_t seq_len = cfg.train.seq_len / (sharding.cp ? sharding.cp->degree() : 1);
  auto model = std::make_unique<Model>(cfg.model, cfg.train.micro_batch, seq_len, sharding, layout,
                                       placement);
  // zb-v's lists follow measured costs and its first stage holds the tied embedding's two
  // uses: their gradient sums in one order whatever the lists (bitwise resume).
  model->set_tied_head_apart(cfg.parallel.pp_schedule == "zb-v");
  if (!layout.empty()) wiring.stage = pipeline_stage(*model);
  return model;
}

std::unique_ptr<parallel::pp::Stage> pipeline_stage(Model& model) {
  return std::make_unique<ModelStage>(model);
}

namespace {

// ZeRO-3's side of the model's parameter hooks: the buckets (units) holding the parameters a
// stretch reads are gathered before it and dropped after it; the next stretch's (forward:
// towards the end of the arena, backward: towards its start) is prefetched meanwhile, and
// with the shares on NVMe the one after that has its share read (the gather sends from it).
// With MoE a layer has a unit in each reducer: its dense parameters' over dp x cp, its
// routed experts' over edp; each reducer prefetches its own next unit, the experts' also
// from a stretch that has none (a dense layer, the embedding).
// The live budget (parallel.zero_live_units, DeepSpeed's stage3_max_live_parameters counted
// in units): a prefetch that would leave a reducer with more units whole than the budget is
// skipped, and the unit is gathered (and waited for) where a stretch needs it; with the
// shares on NVMe its share is read ahead instead. A stretch's own units are gathered
// whatever the budget (the tied head reads two), so nothing waits on a unit that never
// goes. The choice depends only on the order of the hooks' calls, which every rank of a
// group makes alike: all issue the same gathers in the same order.
// A dry run (counting) moves no data: it follows the same calls to count the values whole.
class ZeroParameters final : public ParameterHooks {
 public:
  ZeroParameters(std::vector<parallel::GradReducer*> reducers, const ParamStore& params,
                 int live_units, bool counting = false)
      : reducers_(std::move(reducers)), live_units_(live_units), counting_(counting) {
    PENTAD_CHECK(live_units_ >= 1, "ZeRO-3 wants at least one unit whole at a time, got {}",
                 live_units_);
    for (const ParamSpec& spec : params.specs()) {
      Place at;
      for (size_t r = 0; r < reducers_.size() && at.bucket < 0; ++r)
        at = {int(r), reducers_[r]->bucket_of(int64_t(spec.offset))};
      place_.push_back(at);
    }
    for (parallel::GradReducer* r : reducers_) count_.emplace_back(size_t(r->buckets_count()));
    units_.assign(reducers_.size(), 0);
  }
  void need(const std::vector<int>& ids, bool backward) override {
    for (size_t r = 0; r < reducers_.size(); ++r) {
      const std::vector<int> buckets = of(ids, int(r));
      for (int b : buckets) acquire(r, b);
      const bool room = units_whole(r) < live_units_;
      if (buckets.empty()) {  // the experts' reducer at a dense layer or the embedding
        if (room) prefetch(r, beyond(ids, int(r), backward));
        continue;
      }
      // Buckets run from the end of the arena: forward goes to lower indices.
      const auto [low, high] = std::minmax_element(buckets.begin(), buckets.end());
      const int next = backward ? *high + 1 : *low - 1, step = backward ? 1 : -1;
      if (room) prefetch(r, next);
      if (!counting_) reducers_[r]->read_ahead(room ? next + step : next);
    }
  }
  void done(const std::vector<int>& ids) override {
    for (size_t r = 0; r < reducers_.size(); ++r)
      if (r == 0 || !stale_experts_)
        for (int b : of(ids, int(r))) release(r, b);
  }
  const GatheredPeak& peak() const { return peak_; }

 private:
  struct Place {
    int reducer = -1, bucket = -1;  // bucket -1: in no reducer's buckets
  };
  struct Count {  // the dry run's state of one bucket
    bool whole = false;
    int users = 0;
  };
  std::vector<int> of(const std::vector<int>& ids, int reducer) const {
    std::vector<int> buckets;
    for (int id : ids) {
      const Place& at = place_[size_t(id)];
      if (at.reducer == reducer && at.bucket >= 0 &&
          std::find(buckets.begin(), buckets.end(), at.bucket) == buckets.end())
        buckets.push_back(at.bucket);
    }
    return buckets;
  }
  // The unit of `reducer` holding its nearest parameter beyond the stretch (forward: after
  // it in the arena, backward: before), so that the first MoE layer after dense ones finds its
  // experts on their way; -1: none. Ids run in arena order (no pipeline at stage 3). A tied
  // head in the final stretch hides the layers before it from backward: none then.
  int beyond(const std::vector<int>& ids, int reducer, bool backward) const {
    if (ids.empty()) return -1;
    const auto [low, high] = std::minmax_element(ids.begin(), ids.end());
    const int step = backward ? -1 : 1;
    for (int id = (backward ? *low : *high) + step; id >= 0 && id < int(place_.size()); id += step)
      if (const Place& at = place_[size_t(id)]; at.reducer == reducer && at.bucket >= 0)
        return at.bucket;
    return -1;
  }
  // The reducers' calls, or in a dry run their effect on which units are whole.
  int units_whole(size_t r) const { return counting_ ? units_[r] : reducers_[r]->units_whole(); }
  void prefetch(size_t r, int b) {
    if (!counting_) return reducers_[r]->prefetch(b);
    if (b < 0 || b >= reducers_[r]->buckets_count() || count_[r][size_t(b)].whole) return;
    count_[r][size_t(b)].whole = true;
    ++units_[r];
    now_.whole += reducers_[r]->bucket_elements(b);
    now_.others += reducers_[r]->bucket_elements(b) - reducers_[r]->bucket_share(b);
    peak_.whole = std::max(peak_.whole, now_.whole);
    peak_.others = std::max(peak_.others, now_.others);
  }
  void acquire(size_t r, int b) {
    if (!counting_) return reducers_[r]->acquire(b);
    prefetch(r, b);
    ++count_[r][size_t(b)].users;
  }
  void release(size_t r, int b) {
    if (!counting_) return reducers_[r]->release(b);
    Count& c = count_[r][size_t(b)];
    if (--c.users > 0) return;
    c.whole = false;
    --units_[r];
    now_.whole -= reducers_[r]->bucket_elements(b);
    now_.others -= reducers_[r]->bucket_elements(b) - reducers_[r]->bucket_share(b);
  }
  std::vector<parallel::GradReducer*> reducers_;
  std::vector<Place> place_;  // per parameter id
  const int live_units_;      // per reducer
  const bool counting_;
  std::vector<std::vector<Count>> count_;  // dry run: per reducer, per bucket
  std::vector<int> units_;                 // dry run: per reducer, the units whole
  GatheredPeak now_, peak_;
  // Planted for the layout test: the experts' units, once gathered, are never dropped.
  const bool stale_experts_ = bug_injected("zero3-moe-stale-experts");
};

}  // namespace

std::unique_ptr<ParameterHooks> zero_parameters(std::vector<parallel::GradReducer*> reducers,
                                                const ParamStore& params, int live_units) {
  return std::make_unique<ZeroParameters>(std::move(reducers), params, live_units);
}

GatheredPeak zero3_gathered_peak(std::vector<parallel::GradReducer*> reducers,
                                 const ParamStore& params,
                                 const std::vector<std::vector<int>>& stretches, int live_units) {
  ZeroParameters dry(std::move(reducers), params, live_units, /*counting=*/true);
  for (const std::vector<int>& ids : stretches) {  // forward
    dry.need(ids, false);
    dry.done(ids);
  }
  // Backward: the first stretch, the embedding (no pipeline at stage 3), reads no parameter.
  for (size_t k = stretches.size(); k-- > 1;) {
    dry.need(stretches[k], true);
    dry.done(stretches[k]);
  }
  return dry.peak();
}

}  // namespace pentad
