#include "optim/host_offload.h"

#include <algorithm>

#include "core/check.h"

namespace pentad {

std::vector<HostChunk> plan_host_chunks(const ParamStore& params, const StateShard& shard,
                                        int64_t max_elements) {
  PENTAD_CHECK(max_elements > 0, "plan_host_chunks: max_elements {} must be positive",
               max_elements);
  std::vector<HostChunk> chunks;
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
    for (const StateShard::Piece& piece : shard.pieces(params.spec(id))) {
      // Equal chunks, as AdamW::step cuts them on the device.
      const int64_t parts = (piece.count + max_elements - 1) / max_elements;
      const int64_t per_part = (piece.count + parts - 1) / parts;
      for (int64_t done = 0; done < piece.count; done += per_part)
        chunks.push_back(
            {piece.arena + done, piece.shard + done, std::min(per_part, piece.count - done), id});
    }
  return chunks;
}

HostOffload::HostOffload(const ParamStore& params, const StateShard& shard, int64_t max_elements)
    : chunks_(plan_host_chunks(params, shard, max_elements)) {
  for (const HostChunk& c : chunks_) slot_elements_ = std::max(slot_elements_, c.count);
  staging_ = Arena("optimizer offload staging (page-locked)",
                   std::max<size_t>(1, size_t(4 * slot_elements_) * sizeof(float)), Device::CPU);
  // Page-locked, so that the copies run on their streams without the host driving them.
  host_pin(staging_.base(), staging_.capacity());
}

HostOffload::~HostOffload() {
  host_unpin(staging_.base());
}

void HostOffload::step(ParamStore& params, const Tensor& grads, const Update& update,
                       const BeforeChunk& before_chunk) {
  if (chunks_.empty()) return;
  const Device device = params.device();
  float* const arena = params.all_params().f32();
  const float* const g = grads.data ? grads.f32() : params.all_grads().f32();
  float* const staging = static_cast<float*>(staging_.base());
  // Slot s: parameters at 2 s x slot_elements_, gradients right after them.
  auto slot_params = [&](size_t k) { return staging + int64_t(k % 2) * 2 * slot_elements_; };
  auto slot_grads = [&](size_t k) { return slot_params(k) + slot_elements_; };
  const size_t bytes_per = sizeof(float);
  auto download = [&](size_t k) {
    const HostChunk& c = chunks_[k];
    down_.copy(slot_params(k), Device::CPU, arena + c.arena, device, size_t(c.count) * bytes_per);
    down_.copy(slot_grads(k), Device::CPU, g + (grads.data ? c.state : c.arena), device,
               size_t(c.count) * bytes_per);
  };
  // Both streams behind every kernel issued so far: the gradients' reduction and clipping
  // (downloads), and whatever still reads the parameters (uploads overwrite them).
  down_.begin_after_compute();
  up_.begin_after_compute();
  download(0);
  for (size_t k = 0; k < chunks_.size(); ++k) {
    down_.synchronize();  // chunk k is on the host
    if (k + 1 < chunks_.size()) {
      up_.synchronize();  // chunk k - 1's upload has left the slot chunk k + 1 comes into
      download(k + 1);
    }
    const HostChunk& c = chunks_[k];
    if (before_chunk) before_chunk(c);
    update(c, slot_params(k), slot_grads(k));
    up_.copy(arena + c.arena, device, slot_params(k), Device::CPU, size_t(c.count) * bytes_per);
  }
  up_.synchronize();  // the new values are in the arena before any later kernel reads them
}

}  // namespace pentad
