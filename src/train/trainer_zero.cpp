// The trainer's gradient reduction and ZeRO: the dense parameters' reducer over dp x cp,
// the MoE experts' over edp, the one optimizer shard over both, and the gradient norm
// summed over whichever ranks hold each share; the optimizer step, around a snapshot in
// flight, and ZeRO's parameters gathered after it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "train/trainer.h"

namespace pentad {

void Trainer::build_reducers(size_t bucket_bytes) {
  // Dense gradients sum over dp x cp, MoE experts' over edp (the ranks holding the same
  // experts): each reducer leaves the other's parameters out of its buckets.
  const ParallelConfig& par = cfg_.parallel;
  ParamStore& params = model_->params();
  // ZeRO-3 gathers parameters a layer at a time: one bucket per layer ("layers.<l>"), one
  // for the embedding, one for the final norm and head. Each reducer cuts its own part of a
  // layer: the dense reducer the attention, norms, shared experts and router; the experts'
  // reducer the routed experts of an MoE layer (adjacent in the arena, after the router).
  // ZeRO-2 under pipelining reduces one chunk's gradients at a time (train/grad_sync.h): no
  // bucket holds two chunks' parameters.
  const std::vector<int64_t> chunks = model_->chunk_param_offsets();
  parallel::GradReducer::Unit unit;
  // Under pipelining the tied embedding's two copies are units of their own, cut alike.
  const std::string tied = mesh_ && mesh_->embedding_group() && cfg_.model.tie_embeddings
                               ? params.spec(embedding_id()).name
                               : "";
  if (par.zero == 3)
    unit = [tied](const ParamSpec& p) {
      if (!tied.empty() && p.name == tied) return p.name;
      if (p.name.rfind("layers.", 0) != 0) return std::string();
      return p.name.substr(0, p.name.find('.', 7));
    };
  else if (par.zero == 2 && pipeline_)
    unit = [chunks](const ParamSpec& p) {
      const auto after = std::upper_bound(chunks.begin(), chunks.end(), int64_t(p.offset));
      return std::to_string(after - chunks.begin());
    };
  // ZeRO-3 with the parameters on NVMe: the arena backs none of them; each reducer's compact
  // shares sit in the optimizer's shard where optimizer_shard() puts them (the dense
  // reducer's from 0, the experts' after all of the dense ones), and each unit's share is
  // read from the file straight into the buffer it is gathered in (the optimizer is built
  // after the reducers, before the first read). The arrival waits for the file read; on a
  // device it queues the upload on the compute stream, which the unit's all-gather then
  // follows (NCCL's stream waits for it).
  const bool in_file = parameter_shares_in_file();
  auto from_file = [this, in_file](int64_t first) {
    return !in_file ? parallel::GradReducer::FetchShare()
                    : [this, first](int64_t shard, int64_t count, float* into) {
                        const uint64_t read = optimizer_->start_param_read(first + shard, count);
                        return parallel::GradReducer::Arrival(
                            [this, read, into] { optimizer_->finish_param_read(read, into); });
                      };
  };
  if (mesh_ && mesh_->dp_cp().size() > 1) {
    // ZeRO under pipelining: the tied embedding's two copies (first and last stage) must be
    // cut into the same shares, so each is a bucket of its own (`tied` above).
    // (Only the end stages hold it, and under zb-v's V one stage holds both uses.)
    reducer_ = std::make_unique<parallel::GradReducer>(
        mesh_->dp_cp(), params, bucket_bytes, int(par.zero),
        [](const ParamSpec& p) { return !p.expert; },
        [tied](const ParamSpec& p) { return !tied.empty() && p.name == tied; }, unit, from_file(0));
  }
  if (!mesh_ || !cfg_.model.is_moe()) return;
  // ZeRO shards the experts' state over edp, even where edp is 1 (there the reduce-scatter
  // is a copy): the optimizer reads one compact buffer of reduced gradients.
  const int edp = mesh_->degree(parallel::Axis::EDP);
  const bool expert_zero = zero_stage() > 0;
  if ((edp > 1 || expert_zero) &&
      !bug_injected("moe-skip-edp-reduce"))  // a planted bug the layout test must catch
    expert_reducer_ = std::make_unique<parallel::GradReducer>(
        mesh_->group(parallel::Axis::EDP), params, bucket_bytes, expert_zero ? zero_stage() : 0,
        [](const ParamSpec& p) { return p.expert; }, parallel::GradReducer::Filter(), unit,
        from_file(reducer_ ? reducer_->shard().numel : 0));
  if (!expert_zero || !expert_reducer_) return;
  // One shard over both: the dense shares, then the experts'.
  const StateShard& dense = reducer_->shard();
  zero_grads_ =
      Arena("reduced gradient shares (dense and experts)",
            size_t(dense.numel + expert_reducer_->shard().numel) * sizeof(float), params.device());
  zero_grads_.discard(0, zero_grads_.capacity());  // zeros, resident once written
  float* const base = static_cast<float*>(zero_grads_.base());
  auto part = [&](int64_t at, int64_t count) {
    return view_of(base + at, Shape{count}, DType::F32, params.device());
  };
  reducer_->place_shares(part(0, dense.numel));
  expert_reducer_->place_shares(part(dense.numel, expert_reducer_->shard().numel));
}

bool Trainer::parameter_shares_in_file() const {
  // ZeRO-3 (a dp x cp group of more than one rank) with the parameters on NVMe.
  const ParallelConfig& par = cfg_.parallel;
  return par.zero == 3 && par.offload == "nvme" && par.offload_params && mesh_ &&
         mesh_->dp_cp().size() > 1;
}

bool Trainer::grads_come_down_early() const {
  // Host-offloaded AdamW (a device's parameters, parallel.offload "cpu" or "nvme"), with a
  // reducer to say when a bucket is final. Not under pipelining with a tied embedding (the
  // two end stages sum its gradients after the reducers finish) nor at ZeRO-2 and -3 under
  // pipelining (each pass reduces, and which is a bucket's last is the schedule's).
  return optimizer_->on_host() && (reducer_ || expert_reducer_) &&
         !(mesh_ && mesh_->embedding_group() && cfg_.model.tie_embeddings) &&
         !(pipeline_ && zero_stage() >= 2);
}

void Trainer::download_grads_during_backward(bool on) {
  // Each bucket's reduced gradients come down as soon as its last reduction of the step is
  // done (optim/host_offload.h).
  if (!grads_come_down_early()) return;
  // Where the optimizer reads them: ZeRO's compact shares (the dense reducer's, then the
  // experts'), or the gradient arena.
  const float* const grads =
      zero_stage() ? reduced_shares().f32() : model_->params().all_grads().f32();
  int64_t first = 0;
  for (parallel::GradReducer* r : {reducer_.get(), expert_reducer_.get()}) {
    if (!r) continue;
    r->on_reduced(!on ? parallel::GradReducer::Reduced()
                      : [this, grads, first](int64_t at, int64_t count) {
                          optimizer_->download_early_grads(grads, first + at, count);
                        });
    if (zero_stage()) first += r->shard().numel;
  }
}

StateShard Trainer::optimizer_shard() const {
  if (!zero_stage()) return {};
  if (!zero_grads_.base()) return reducer_->shard();
  return StateShard::merge(reducer_->shard(), expert_reducer_->shard());
}

Tensor Trainer::reduced_shares() const {
  if (!zero_stage()) return {};
  if (!zero_grads_.base()) return reducer_->shard_grads();
  return view_of(zero_grads_.base(), Shape{optimizer_->shard().numel}, DType::F32,
                 model_->params().device());
}

// An expert's parameter replicated over etp (the GPT-2 experts' output bias) counts on the
// first etp rank only.
bool Trainer::counts_etp_replicated() const {
  return !mesh_ || mesh_->coord(parallel::Axis::ETP) == 0;
}

void Trainer::grad_squares_into(const Tensor& sums) {
  grad_sum_squares_into(sums, model_->params(), counts_etp_replicated(),
                        zero_stage() ? &optimizer_->shard() : nullptr, reduced_shares());
}

double Trainer::grad_norm(const GradSquares* local) {
  GradSquares squares =
      local ? *local
            : grad_sum_squares(model_->params(), counts_etp_replicated(),
                               zero_stage() ? &optimizer_->shard() : nullptr, reduced_shares());
  static_assert(sizeof(GradSquares) == 3 * sizeof(double));
  // With ZeRO each rank holds its shares of the gradients: the dense ones of the dp x cp
  // group's, the experts' of the edp group's.
  if (zero_stage()) mesh_->dp_cp().all_reduce(view_of(&squares.sharded, Shape{2}, DType::F64));
  if (zero_stage() && cfg_.model.is_moe() && mesh_->degree(parallel::Axis::EDP) > 1)
    mesh_->group(parallel::Axis::EDP).all_reduce(view_of(&squares.expert, Shape{1}, DType::F64));
  if (model_->tp().degree() > 1)  // shards add up over tp; replicated ones count once
    mesh_->group(parallel::Axis::TP).all_reduce(view_of(&squares.sharded, Shape{1}, DType::F64));
  if (mesh_ && cfg_.model.is_moe() && mesh_->expert_model().size() > 1)  // each expert once
    mesh_->expert_model().all_reduce(view_of(&squares.expert, Shape{1}, DType::F64));
  return std::sqrt(all_reduce_pp(squares.sharded + squares.replicated + squares.expert));
}

void Trainer::optimizer_step(float lr) {
  ParamStore& p = model_->params();
  // Parameters on NVMe: a share read ahead for a unit the step did not reach must land
  // before the update rewrites the file.
  settle_offloaded_shares();
  optimizer_->step(p, lr, checkpoints_->before_update(), checkpoints_->update_out_of_place(),
                   reduced_shares());
  checkpoints_->updated();
  if (zero_stage()) {
    checkpoints_->before_params_written();  // the all-gather writes every parameter
    // Stage 1, 2: on every rank now; stage 3: when next used. MoE at stage 3: after the
    // bias update (finish_moe_step), which writes every rank's whole copy of the expert bias.
    if (zero_stage() < 3 || !cfg_.model.is_moe()) grad_sync_->gather_updated_params();
  }
  kernels::refresh_weights(p);  // the compute copy follows the new master values
}

void Trainer::offload_parameter_shares() {
  // The initial values go straight to the file: the arena backs none of them.
  const ParamStore& p = model_->params();
  const uint64_t seed = cfg_.train.seed;
  optimizer_->store_params(p, [&](int id, float* out) { ParamStore::draw(p.spec(id), seed, out); });
  // On a device each read comes up through page-locked slots as large as the largest share.
  int64_t largest = 0;
  for (const parallel::GradReducer* r : zero_reducers())
    for (int b = 0; b < r->buckets_count(); ++b) largest = std::max(largest, r->bucket_share(b));
  optimizer_->reserve_param_uploads(largest);
}

void Trainer::settle_offloaded_shares() {
  if (!optimizer_->params_offloaded()) return;
  for (parallel::GradReducer* r : zero_reducers()) r->release_all();
}

void Trainer::update_expert_bias(const std::vector<double>& counts) {
  ParamStore& p = model_->params();
  const bool in_file = optimizer_->params_offloaded();
  if (!in_file && !p.sparse_params()) {
    model_->update_expert_bias(counts);
    return;
  }
  // This rank's shares of the biases' master values are in the optimizer's file, or in a
  // sparse arena that backs nothing else of them: into a whole copy (sparse: a buffer placed
  // as the biases' home; otherwise the arena), moved, and back. Every rank moves its whole
  // copy alike; the other shares' values are dropped (their owners moved them too).
  float* const arena = p.all_params().f32();
  const Device device = p.device();
  const std::vector<int> ids = model_->expert_bias_ids();
  Arena whole;
  if (p.sparse_params()) {
    int64_t total = 0;
    for (int id : ids) total += p.spec(id).local_shape.numel();
    whole = Arena("expert biases (update)", size_t(total) * sizeof(float), device);
    whole.zero();
    int64_t at = 0;
    for (int id : ids) {
      const int64_t offset = int64_t(p.spec(id).offset);
      p.place_params(offset, offset + 1, static_cast<float*>(whole.base()) + at, nullptr);
      at += p.spec(id).local_shape.numel();
    }
  }
  struct Share {
    StateShard::Piece piece;
    float* home;  // the piece in the whole copy
  };
  std::vector<Share> mine;
  for (int id : ids)
    for (const StateShard::Piece& piece : optimizer_->shard().pieces(p.spec(id)))
      mine.push_back({piece, p.param(id).f32() + (piece.arena - int64_t(p.spec(id).offset))});
  // Through host memory whatever the device (a few values per MoE layer; on a device the
  // copies wait): the file's reads and writes take host pointers.
  std::vector<float> host;
  for (const Share& s : mine) {
    const size_t bytes = size_t(s.piece.count) * sizeof(float);
    if (in_file) {
      host.resize(size_t(s.piece.count));
      optimizer_->read_state(AdamW::kParamTensor, s.piece.shard, s.piece.count, host.data());
      copy_bytes(s.home, device, host.data(), Device::CPU, bytes);
    } else {
      copy_bytes(s.home, device, arena + s.piece.arena, device, bytes);
    }
  }
  model_->update_expert_bias(counts);
  for (const Share& s : mine) {
    const size_t bytes = size_t(s.piece.count) * sizeof(float);
    if (in_file) {
      host.resize(size_t(s.piece.count));
      copy_bytes(host.data(), Device::CPU, s.home, device, bytes);
      optimizer_->write_state(AdamW::kParamTensor, s.piece.shard, s.piece.count, host.data());
    } else {
      copy_bytes(arena + s.piece.arena, device, s.home, device, bytes);
    }
  }
  for (int id : ids)
    if (p.sparse_params())
      p.unplace_params(int64_t(p.spec(id).offset), int64_t(p.spec(id).offset) + 1);
}

void Trainer::whole_parameters(bool all) {
  if (zero_stage() != 3) return;
  for (parallel::GradReducer* r : zero_reducers())
    for (int b = 0; b < r->buckets_count(); ++b)
      if (all)
        r->acquire(b);
      else
        r->release(b);
}

int64_t Trainer::zero_buffers_made() const {
  int64_t made = 0;
  for (const parallel::GradReducer* r : zero_reducers()) made += r->buffers_made();
  return made;
}

std::vector<parallel::GradReducer*> Trainer::zero_reducers() const {
  std::vector<parallel::GradReducer*> reducers;
  if (zero_stage() && reducer_) reducers.push_back(reducer_.get());
  if (zero_stage() && zero_grads_.base()) reducers.push_back(expert_reducer_.get());
  return reducers;
}

}  // namespace pentad
