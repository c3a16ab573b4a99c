#include "optim/host_offload.h"

#include <algorithm>
#include <iterator>

#include "core/check.h"
#include "kernels/ops.h"

namespace pentad {

std::vector<HostChunk> plan_host_chunks(const ParamStore& params, const StateShard& shard,
                                        int64_t max_elements, int64_t group_elements) {
  PENTAD_CHECK(max_elements > 0, "plan_host_chunks: max_elements {} must be positive",
               max_elements);
  PENTAD_CHECK(group_elements >= 0, "plan_host_chunks: group_elements {} is negative",
               group_elements);
  std::vector<HostChunk> chunks;
  // Equal chunks of `count` elements from (arena, state), as AdamW::step cuts them on the
  // device.
  auto cut = [&](int64_t arena, int64_t state, int64_t count, int id) {
    const int64_t parts = (count + max_elements - 1) / max_elements;
    const int64_t per_part = (count + parts - 1) / parts;
    for (int64_t done = 0; done < count; done += per_part)
      chunks.push_back({arena + done, state + done, std::min(per_part, count - done), id});
  };
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
    for (const StateShard::Piece& piece : shard.pieces(params.spec(id))) {
      if (group_elements == 0) {
        cut(piece.arena, piece.shard, piece.count, id);
        continue;
      }
      for (int64_t done = 0; done < piece.count;) {  // up to the next group boundary
        const int64_t state = piece.shard + done;
        const int64_t boundary = (state / group_elements + 1) * group_elements;
        const int64_t count = std::min(piece.count - done, boundary - state);
        cut(piece.arena + done, state, count, id);
        done += count;
      }
    }
  // In state order, so that each sub-group is a run of chunks (chunks_in()): a merged shard
  // (StateShard::merge: the dense parameters' shares, then the experts') orders its state
  // otherwise than the arena.
  if (group_elements > 0)
    std::sort(chunks.begin(), chunks.end(),
              [](const HostChunk& a, const HostChunk& b) { return a.state < b.state; });
  return chunks;
}

HostOffload::HostOffload(const ParamStore& params, const StateShard& shard, int64_t max_elements,
                         int64_t group_elements, bool params_on_host)
    : chunks_(plan_host_chunks(params, shard, max_elements, group_elements)),
      params_on_host_(params_on_host) {
  for (const HostChunk& c : chunks_) slot_elements_ = std::max(slot_elements_, c.count);
  const int64_t per_slot = (params_on_host_ ? 1 : 2) * slot_elements_;
  staging_ = Arena("optimizer offload staging (page-locked)",
                   std::max<size_t>(1, size_t(2 * per_slot) * sizeof(float)), Device::CPU);
  // Page-locked, so that the copies run on their streams without the host driving them.
  host_pin(staging_.base(), staging_.capacity());
}

HostOffload::~HostOffload() {
  host_unpin(staging_.base());
  host_unpin(early_.base());
}

void HostOffload::reserve_early_grads() {
  if (early_.base()) return;
  int64_t numel = 0;
  for (const HostChunk& c : chunks_) numel = std::max(numel, c.state + c.count);
  early_ = Arena("optimizer offload: gradients brought down early (page-locked)",
                 std::max<size_t>(1, size_t(numel) * sizeof(float)), Device::CPU);
  host_pin(early_.base(), early_.capacity());
  came_early_.assign(chunks_.size(), 0);
}

void HostOffload::download_early_grads(const float* grads, Device device, int64_t state,
                                       int64_t count) {
  PENTAD_CHECK(early_.base(), "download_early_grads before reserve_early_grads");
  if (count <= 0) return;
  down_.begin_after_compute();
  down_.copy(static_cast<float*>(early_.base()) + state, Device::CPU, grads + state, device,
             size_t(count) * sizeof(float));
  for (size_t k = 0; k < chunks_.size(); ++k)
    if (chunks_[k].state >= state && chunks_[k].state + chunks_[k].count <= state + count)
      came_early_[k] = 1;
}

void HostOffload::forget_early_grads() {
  std::fill(came_early_.begin(), came_early_.end(), 0);
  grad_scale_ = 1.0f;
  early_used_ = 0;
}

std::pair<size_t, size_t> HostOffload::chunks_in(int64_t state_begin, int64_t state_end) const {
  // Cut at sub-groups, the plan is in state order.
  auto first = std::lower_bound(chunks_.begin(), chunks_.end(), state_begin,
                                [](const HostChunk& c, int64_t at) { return c.state < at; });
  auto last = std::lower_bound(first, chunks_.end(), state_end,
                               [](const HostChunk& c, int64_t at) { return c.state < at; });
  PENTAD_CHECK(first == last || std::prev(last)->state + std::prev(last)->count <= state_end,
               "chunk at {} (+{}) straddles the end {} of the range asked for",
               std::prev(last)->state, std::prev(last)->count, state_end);
  return {size_t(first - chunks_.begin()), size_t(last - chunks_.begin())};
}

void HostOffload::step_chunks(ParamStore& params, const Tensor& grads, size_t first, size_t last,
                              const Update& update, const BeforeChunk& before_chunk) {
  PENTAD_CHECK(first <= last && last <= chunks_.size(), "chunks [{}, {}) of {}", first, last,
               chunks_.size());
  if (first == last) return;
  const Device device = params.device();
  float* const arena = params.all_params().f32();
  const float* const g = grads.data ? grads.f32() : params.all_grads().f32();
  float* const staging = static_cast<float*>(staging_.base());
  // Slot s: parameters at 2 s x slot_elements_, gradients right after them; with the
  // parameters on the host, gradients only, at s x slot_elements_.
  const int64_t per_slot = (params_on_host_ ? 1 : 2) * slot_elements_;
  auto slot_params = [&](size_t k) { return staging + int64_t(k % 2) * per_slot; };
  auto slot_grads = [&](size_t k) {
    return slot_params(k) + (params_on_host_ ? 0 : slot_elements_);
  };
  const size_t bytes_per = sizeof(float);
  auto early = [&](size_t k) { return !came_early_.empty() && came_early_[k]; };
  // A chunk's gradients, in staging or where they came down early, clipped here.
  auto chunk_grads = [&](size_t k) -> const float* {
    const HostChunk& c = chunks_[k];
    float* at = slot_grads(k);
    if (early(k)) {
      ++early_used_;
      at = static_cast<float*>(early_.base()) + c.state;
    }
    if (grad_scale_ != 1.0f)
      kernels::scale(view_of(at, Shape{c.count}, DType::F32, Device::CPU), grad_scale_);
    return at;
  };
  auto download = [&](size_t k) {
    const HostChunk& c = chunks_[k];
    if (!params_on_host_)
      down_.copy(slot_params(k), Device::CPU, arena + c.arena, device, size_t(c.count) * bytes_per);
    if (!early(k))
      down_.copy(slot_grads(k), Device::CPU, g + (grads.data ? c.state : c.arena), device,
                 size_t(c.count) * bytes_per);
  };
  // Both streams behind every kernel issued so far: the gradients' reduction and clipping
  // (downloads), and whatever still reads the parameters (uploads overwrite them).
  down_.begin_after_compute();
  if (!params_on_host_) up_.begin_after_compute();
  download(first);
  for (size_t k = first; k < last; ++k) {
    down_.synchronize();  // chunk k is on the host
    if (k + 1 < last) {
      // Chunk k - 1's upload has left the slot chunk k + 1 comes into (with the parameters
      // on the host nothing goes up, and chunk k - 1's update, done, read its gradients).
      if (!params_on_host_) up_.synchronize();
      download(k + 1);
    }
    const HostChunk& c = chunks_[k];
    if (before_chunk) before_chunk(c);
    if (params_on_host_) {
      update(c, nullptr, chunk_grads(k));
      continue;
    }
    update(c, slot_params(k), chunk_grads(k));
    up_.copy(arena + c.arena, device, slot_params(k), Device::CPU, size_t(c.count) * bytes_per);
  }
  // The new values are in the arena before any later kernel reads them.
  if (!params_on_host_) up_.synchronize();
}

}  // namespace pentad
