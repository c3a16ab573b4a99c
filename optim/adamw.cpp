#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "optim/host_offload.h"

namespace pentad {

float learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps)
    return cfg.lr * static_cast<float>(step + 1) / static_cast<float>(cfg.warmup_steps);
  if (cfg.decay == "constant") return cfg.lr;
  const float min_lr = cfg.lr * cfg.min_lr_ratio;
  const int64_t decay_steps = total_steps - cfg.warmup_steps;
  if (decay_steps <= 0) return cfg.lr;
  const double ratio = std::min(
      1.0, static_cast<double>(step - cfg.warmup_steps) / static_cast<double>(decay_steps));
  double factor = cfg.decay == "linear" ? 1.0 - ratio : 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + factor * (cfg.lr - min_lr));
}

namespace {

// Calls add(slot, pieces) for every parameter the norm counts, in id order: slot 0 for a
// sharded one, 1 replicated, 2 expert; pieces its gradient (or, with ZeRO, its shares).
template <typename Add>
void for_each_counted_grad(const ParamStore& params, bool count_etp_replicated,
                           const StateShard* shard, const Tensor& grads, Add&& add) {
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    const ParamSpec& spec = params.spec(id);
    if (spec.pipeline_copy) continue;   // the original is counted on its own stage
    if (spec.tp_replica > 0) continue;  // a copy of a 2D tensor-parallel slice: counted once
    if (spec.expert && spec.shard_dim < 0 && !count_etp_replicated) continue;
    std::vector<Tensor> pieces;
    if (!shard) {
      pieces.push_back(params.grad(id));
    } else {
      for (const StateShard::Piece& piece : shard->pieces(spec))
        pieces.push_back(
            view_of(grads.f32() + piece.shard, Shape{piece.count}, DType::F32, grads.device));
    }
    add(spec.expert ? 2 : spec.shard_dim >= 0 ? 0 : 1, pieces);
  }
}

}  // namespace

GradSquares grad_sum_squares(const ParamStore& params, bool count_etp_replicated,
                             const StateShard* shard, const Tensor& grads) {
  GradSquares sums;
  double* slots[3] = {&sums.sharded, &sums.replicated, &sums.expert};
  for_each_counted_grad(params, count_etp_replicated, shard, grads,
                        [&](int slot, const std::vector<Tensor>& pieces) {
                          double sum = 0.0;
                          for (const Tensor& t : pieces) sum += kernels::sum_squares(t);
                          *slots[slot] += sum;
                        });
  return sums;
}

void grad_sum_squares_into(const Tensor& sums, const ParamStore& params, bool count_etp_replicated,
                           const StateShard* shard, const Tensor& grads) {
  PENTAD_CHECK(sums.dtype == DType::F64 && sums.numel() == 3, "grad_sum_squares_into: sums {} {}",
               dtype_name(sums.dtype), sums.shape.str());
  for_each_counted_grad(
      params, count_etp_replicated, shard, grads, [&](int slot, const std::vector<Tensor>& pieces) {
        const Tensor total =
            view_of(static_cast<double*>(sums.data) + slot, Shape{1}, DType::F64, sums.device);
        for (const Tensor& t : pieces) kernels::sum_squares_into(total, t);
      });
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void clip_gradients(ParamStore& params, double norm, float max_norm, const Tensor& grads) {
  const float coef = clip_coefficient(norm, max_norm);
  if (coef != 1.0f) kernels::scale(grads.data ? grads : params.all_grads(), coef);
}

AdamW::AdamW(const OptimConfig& cfg, const ParamStore& params, StateShard shard,
             const NvmeOptions* nvme, const std::string& file_name, bool offload_params,
             bool on_host)
    : cfg_(cfg),
      shard_(shard.ranges.empty() ? StateShard::whole(params.numel()) : std::move(shard)),
      params_offloaded_(offload_params),
      params_device_(params.device()) {
  PENTAD_CHECK(nvme || !offload_params, "parameters offload to NVMe only");
  PENTAD_CHECK(!nvme || on_host || params.device() == Device::CPU,
               "AdamW on a device's parameters with its state on NVMe needs on_host");
  if (nvme) {
    nvme_ = std::make_unique<NvmeState>(*nvme, file_name, shard_.numel, offload_params ? 3 : 2);
    if (on_host) {  // device parameters: chunks cut at the sub-groups, streamed inside each
      // With the parameters in the file only the gradients cross the bus.
      host_ = std::make_unique<HostOffload>(params, shard_, int64_t(kChunkElements),
                                            nvme_->subgroup_elements(), offload_params);
      return;  // the file reads as zeros
    }
    for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
      for (const StateShard::Piece& piece : shard_.pieces(params.spec(id)))
        segments_.push_back({piece.shard, piece.arena, piece.count,
                             params.spec(id).weight_decay ? cfg_.weight_decay : 0.0f});
    std::sort(segments_.begin(), segments_.end(),
              [](const Segment& a, const Segment& b) { return a.shard < b.shard; });
    return;  // the file reads as zeros
  }
  // On the host the moments need no page-locking: only the staging crosses the bus.
  const Device state_device = on_host ? Device::CPU : params.device();
  m_ = Arena("adam m", size_t(shard_.numel) * sizeof(float), state_device);
  v_ = Arena("adam v", size_t(shard_.numel) * sizeof(float), state_device);
  if (on_host) host_ = std::make_unique<HostOffload>(params, shard_, int64_t(kChunkElements));
  m_.zero();
  v_.zero();
}

AdamW::~AdamW() = default;

void AdamW::reset() {
  m_.zero();
  v_.zero();
  if (nvme_)
    nvme_->update([](int64_t begin, int64_t end, float* const* state) {
      std::fill_n(state[0], end - begin, 0.0f);
      std::fill_n(state[1], end - begin, 0.0f);
    });
  step_ = 0;
}

void AdamW::read_state(int tensor, int64_t begin, int64_t count, float* out) {
  PENTAD_CHECK(nvme_, "read_state: the state is not offloaded");
  nvme_->read(tensor, begin, begin + count, out);
}

void AdamW::write_state(int tensor, int64_t begin, int64_t count, const float* in) {
  PENTAD_CHECK(nvme_, "write_state: the state is not offloaded");
  nvme_->write(tensor, begin, begin + count, in);
}

void AdamW::store_params(const ParamStore& params, const ParamValues& values) {
  PENTAD_CHECK(params_offloaded_, "store_params: the parameters are not offloaded");
  std::vector<float> host;  // one parameter's values at a time
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    const ParamSpec& spec = params.spec(id);
    const std::vector<StateShard::Piece> pieces = shard_.pieces(spec);
    if (pieces.empty()) continue;
    host.resize(size_t(spec.local_shape.numel()));
    values(id, host.data());
    for (const StateShard::Piece& piece : pieces)
      nvme_->write(kParamTensor, piece.shard, piece.shard + piece.count,
                   host.data() + (piece.arena - int64_t(spec.offset)));
  }
}

void AdamW::reserve_param_uploads(int64_t largest_read) {
  PENTAD_CHECK(params_offloaded_, "reserve_param_uploads: the parameters are not offloaded");
  if (params_device_ == Device::CPU) return;  // the reads land in the arena itself
  // Three slots: a unit's share is read one unit ahead of the prefetched one, so at most
  // two uploads are queued ahead of the compute stream when the third slot is wanted.
  param_uploads_ = std::make_unique<StagedUpload>(3, size_t(largest_read) * sizeof(float));
}

uint64_t AdamW::start_param_read(int64_t begin, int64_t count) {
  PENTAD_CHECK(params_offloaded_, "start_param_read: the parameters are not offloaded");
  return nvme_->start_read(kParamTensor, begin, begin + count);
}

void AdamW::finish_param_read(uint64_t read, float* into) {
  if (params_device_ == Device::CPU) {
    nvme_->finish_read(read, into);
    return;
  }
  PENTAD_CHECK(param_uploads_, "finish_param_read on a device needs reserve_param_uploads()");
  const size_t bytes = size_t(nvme_->read_elements(read)) * sizeof(float);
  nvme_->finish_read(read, static_cast<float*>(param_uploads_->stage(bytes)));
  param_uploads_->upload(into);
}

void AdamW::step_offloaded(ParamStore& params, float lr, const Tensor& grads) {
  // The master values: in the file (the sub-group's third tensor, at shard offsets) or in
  // the arena (at arena offsets).
  float* const arena = params.all_params().f32();
  float* const g = grads.data ? grads.f32() : params.all_grads().f32();
  auto flat = [](float* at, int64_t count) {
    return view_of(at, Shape{count}, DType::F32, Device::CPU);
  };
  size_t first = 0;  // segments before it end before this sub-group
  nvme_->update([&](int64_t begin, int64_t end, float* const* state) {
    while (first < segments_.size() && segments_[first].shard + segments_[first].count <= begin)
      ++first;
    for (size_t i = first; i < segments_.size() && segments_[i].shard < end; ++i) {
      const Segment& s = segments_[i];
      const int64_t lo = std::max(begin, s.shard), hi = std::min(end, s.shard + s.count);
      const int64_t at = s.arena + (lo - s.shard), n = hi - lo;
      float* const m = state[0] + (lo - begin);
      float* const v = state[1] + (lo - begin);
      float* const p = params_offloaded_ ? state[kParamTensor] + (lo - begin) : arena + at;
      kernels::adamw_update({flat(p, n), flat(m, n), flat(v, n)},
                            {flat(p, n), flat(m, n), flat(v, n)},
                            flat(g + (grads.data ? lo : at), n), lr, cfg_.beta1, cfg_.beta2,
                            cfg_.eps, s.weight_decay, step_);
    }
  });
}

void AdamW::update_chunk(const ParamStore& params, const HostChunk& c, float* p, const float* g,
                         float* m, float* v, float lr) const {
  auto flat = [&](const float* at) {
    return view_of(const_cast<float*>(at), Shape{c.count}, DType::F32, Device::CPU);
  };
  const float wd = params.spec(c.id).weight_decay ? cfg_.weight_decay : 0.0f;
  kernels::adamw_update(flat(p), flat(m), flat(v), flat(g), lr, cfg_.beta1, cfg_.beta2, cfg_.eps,
                        wd, step_);
}

void AdamW::step_nvme_on_host(ParamStore& params, float lr, const Tensor& grads) {
  // The engine's loop outside: while sub-group k's moments are in host buffers (k + 1 being
  // read, k - 1 written), its chunks' parameters and gradients stream down, are updated
  // against them and go back up (HostOffload's two slots). The chunk plan is cut at the
  // sub-groups and in state order, so each sub-group is a run of whole chunks. The device
  // pipeline restarts at each sub-group: one chunk's download (a few MiB over the bus) is
  // not overlapped per sub-group, small beside the sub-group's file I/O.
  // With the parameters offloaded too their values are the sub-group's third tensor: only
  // the gradients come down (p is null), and the new values stay in the file.
  nvme_->update([&](int64_t begin, int64_t end, float* const* state) {
    const auto [first, last] = host_->chunks_in(begin, end);
    float* const m = state[0];
    float* const v = state[1];
    float* const file_params = params_offloaded_ ? state[kParamTensor] : nullptr;
    host_->step_chunks(
        params, grads, first, last, [&, begin](const HostChunk& c, float* p, const float* g) {
          if (file_params) p = file_params + (c.state - begin);
          update_chunk(params, c, p, g, m + (c.state - begin), v + (c.state - begin), lr);
        });
  });
}

void AdamW::step_on_host(ParamStore& params, float lr, const BeforeChunk& before_chunk,
                         const Tensor& grads) {
  float* const m = static_cast<float*>(m_.base());
  float* const v = static_cast<float*>(v_.base());
  host_->step(
      params, grads,
      [&](const HostChunk& c, float* p, const float* g) {
        update_chunk(params, c, p, g, m + c.state, v + c.state, lr);
      },
      before_chunk ? HostOffload::BeforeChunk([&](const HostChunk& c) {
        before_chunk(size_t(c.arena), size_t(c.arena + c.count), size_t(c.state));
      })
                   : HostOffload::BeforeChunk());
}

void AdamW::reserve_early_grads() {
  PENTAD_CHECK(host_, "reserve_early_grads: AdamW does not update on the host");
  host_->reserve_early_grads();
}

void AdamW::download_early_grads(const float* grads, int64_t state, int64_t count) {
  PENTAD_CHECK(host_, "download_early_grads: AdamW does not update on the host");
  host_->download_early_grads(grads, params_device_, state, count);
}

void AdamW::scale_grads_on_host(float coefficient) {
  PENTAD_CHECK(host_, "scale_grads_on_host: AdamW does not update on the host");
  host_->scale_grads(coefficient);
}

void AdamW::forget_early_grads() {
  if (host_) host_->forget_early_grads();
}

size_t AdamW::early_grad_chunks() const {
  return host_ ? host_->early_chunks() : 0;
}

size_t AdamW::host_chunks() const {
  return host_ ? host_->chunks().size() : 0;
}

size_t AdamW::host_staging_bytes() const {
  return (host_ ? host_->staging_bytes() : 0) +
         (param_uploads_ ? param_uploads_->staging_bytes() : 0);
}

void AdamW::allocate_spare() {
  if (has_spare()) return;
  spare_m_ = Arena("adam m (spare set)", m_.capacity(), m_.device());
  spare_v_ = Arena("adam v (spare set)", v_.capacity(), v_.device());
  spare_m_.zero();
  spare_v_.zero();
}

void AdamW::swap_state() {
  PENTAD_CHECK(has_spare(), "the optimizer has no spare moments (allocate_spare)");
  std::swap(m_, spare_m_);
  std::swap(v_, spare_v_);
}

void AdamW::step(ParamStore& params, float lr, const BeforeChunk& before_chunk, bool out_of_place,
                 const Tensor& grads) {
  PENTAD_CHECK(!out_of_place || (has_spare() && params.has_spare()),
               "an optimizer step out of place needs the spare sets (allocate_spare)");
  PENTAD_CHECK(grads.data || shard_.is_whole(params.numel()),
               "a sharded optimizer step needs the reduced gradients of its shard");
  ++step_;
  if (nvme_) {
    PENTAD_CHECK(!out_of_place && !before_chunk,
                 "offloaded state is snapshot between steps (Trainer::save), not during one");
    if (host_)
      step_nvme_on_host(params, lr, grads);
    else
      step_offloaded(params, lr, grads);
    return;
  }
  if (host_) {
    PENTAD_CHECK(!out_of_place,
                 "host-offloaded AdamW state has no spare set: checkpoint.snapshot = \"copy\"");
    step_on_host(params, lr, before_chunk, grads);
    return;
  }
  float* const from_params = params.all_params().f32();
  float* const from_grads = grads.data ? grads.f32() : params.all_grads().f32();
  float* const to_params = out_of_place ? params.spare_params().f32() : from_params;
  void* const to_m = out_of_place ? spare_m_.base() : m_.base();
  void* const to_v = out_of_place ? spare_v_.base() : v_.base();
  auto flat = [&](void* base, size_t at, size_t count) {
    return view_of(static_cast<float*>(base) + at, Shape{static_cast<int64_t>(count)}, DType::F32,
                   params.device());
  };
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    const float wd = params.spec(id).weight_decay ? cfg_.weight_decay : 0.0f;
    for (const StateShard::Piece& piece : shard_.pieces(params.spec(id))) {
      const size_t n = size_t(piece.count);
      // Equal chunks (a short last one would fall below the kernel's threads threshold).
      const size_t chunks = std::max<size_t>(1, (n + kChunkElements - 1) / kChunkElements);
      const size_t per_chunk = (n + chunks - 1) / chunks;
      for (size_t done = 0; done < n; done += per_chunk) {
        const size_t count = std::min(per_chunk, n - done);
        const size_t at = size_t(piece.arena) + done, state = size_t(piece.shard) + done;
        if (before_chunk) before_chunk(at, at + count, state);
        kernels::adamw_update(
            {flat(from_params, at, count), flat(m_.base(), state, count),
             flat(v_.base(), state, count)},
            {flat(to_params, at, count), flat(to_m, state, count), flat(to_v, state, count)},
            flat(from_grads, grads.data ? state : at, count), lr, cfg_.beta1, cfg_.beta2, cfg_.eps,
            wd, step_);
      }
    }
  }
  if (out_of_place) {
    params.swap_params();
    swap_state();
  }
}

}  // namespace pentad
