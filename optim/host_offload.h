#pragma once
// parallel.offload = "cpu" on a device (ZeRO-Offload's split of the work): AdamW's moments
// live in host memory, and each optimizer step streams the shard's parameters and reduced
// gradients through page-locked staging, chunk by chunk:
//   device -> host on one copy stream (behind every kernel issued before the step),
//   the host's AdamW on the chunk (kernels::adamw_update on the CPU: OpenMP, vectorised),
//   host -> device on a second copy stream,
// with two staging slots, so that chunk k + 1 comes down and chunk k - 1 goes up while the
// host updates chunk k.
//
// The device's fp32 arena stays the one home of the master values: the host keeps no copy of
// them between steps. Everything else that writes the arena (initialisation, a checkpoint
// load or in-job restore, ZeRO's all-gather) then needs no host mirror kept in step, which
// an untested path could silently miss. The price is one more crossing of the bus per step:
// the shard's parameters come down (4 bytes an element) beside the gradients (4) and go back
// up (4). The moments (8 bytes an element) never cross: they stay in pageable host memory.
//
// Stream rule: the first download waits for the compute stream (an event); the step returns
// after the last upload has landed (the host waits), so kernels issued afterwards (ZeRO's
// all-gather, the bf16 copy's refresh, the next forward) read the new values.
// Gradients brought down during backward (download_early_grads): the trainer queues each
// bucket's reduced gradients for download as soon as its reduction is done, on the
// download stream, so that the bus carries them while backward computes the layers below.
// A chunk lying wholly inside what came down that way downloads only its parameters at the
// step; any other (a run without a reducer) downloads its gradients at the step as before.
// Clipping is applied on the host (scale_grads: the step's coefficient, the same fp32
// multiply the CPU's clip_gradients does), to every chunk's gradients: the device's copy
// is never scaled, since a scale on the compute stream could overwrite gradients that an
// early download has not read yet.
//
// With parallel.offload = "nvme" the moments live in a file instead (optim/nvme_state.h) and
// AdamW (optim/adamw.cpp) nests the two streams: the NVMe engine's sub-group loop outside
// (sub-group k + 1 read and k - 1 written while k is updated), and inside it this class's
// chunks of sub-group k (step_chunks). The chunk plan is then cut at the sub-group
// boundaries, so that every chunk's moments lie in one sub-group's buffers.
//
// params_on_host (ZeRO-3's parameter shares in that file too, ZeRO-Infinity): the master
// values of the shard are the file's, not the arena's, so only the gradients come down;
// update() gets p = nullptr and updates the values where the caller keeps them (the
// sub-group's buffer), and nothing goes back up: the next all-gather reads them from the
// file (the arena holds no share between uses). The step returns once the last download
// has landed and been used, so the staging is free for the next sub-group.
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "core/params.h"
#include "core/tensor.h"

namespace pentad {

// One piece of the step: count elements inside one parameter.
struct HostChunk {
  int64_t arena = 0;  // where its parameters (and full-arena gradients) start in the arena
  int64_t state = 0;  // where its moments (and compact ZeRO gradients) start in the shard
  int64_t count = 0;
  int id = 0;  // the parameter
};

// The shard's pieces (StateShard::pieces of every parameter) in arena order, cut into equal
// chunks of at most max_elements each (a parameter's last chunk is never a sliver).
// group_elements > 0 (the NVMe sub-group): no chunk crosses a multiple of it in the shard's
// (state) offsets; a piece is cut there first, and each part into equal chunks; and the
// chunks come in state order (which a merged shard's differs from the arena's).
std::vector<HostChunk> plan_host_chunks(const ParamStore& params, const StateShard& shard,
                                        int64_t max_elements, int64_t group_elements = 0);

class HostOffload {
 public:
  // Updates one chunk on the host: p and g hold the chunk's parameters and gradients (staging);
  // the moments are the caller's, at chunk.state.
  using Update = std::function<void(const HostChunk& chunk, float* p, const float* g)>;
  using BeforeChunk = std::function<void(const HostChunk& chunk)>;

  HostOffload(const ParamStore& params, const StateShard& shard, int64_t max_elements,
              int64_t group_elements = 0, bool params_on_host = false);
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  // One step over every chunk, in order. grads: the compact reduced gradients of the shard
  // (ZeRO), or empty for the full gradient arena. before_chunk runs before the chunk's
  // update and upload (a checkpoint copy in flight holds the step back there).
  void step(ParamStore& params, const Tensor& grads, const Update& update,
            const BeforeChunk& before_chunk = {}) {
    step_chunks(params, grads, 0, chunks_.size(), update, before_chunk);
  }
  // The same over chunks [first, last) only, with the same stream rule (the NVMe path: one
  // sub-group's chunks at a time).
  void step_chunks(ParamStore& params, const Tensor& grads, size_t first, size_t last,
                   const Update& update, const BeforeChunk& before_chunk = {});
  // The chunks whose state lies in [state_begin, state_end), as [first, last): the plan
  // must be cut at that range's ends (group_elements), or a chunk would straddle them.
  std::pair<size_t, size_t> chunks_in(int64_t state_begin, int64_t state_end) const;

  // The host copy of the shard's gradients (4 bytes an element, page-locked), once.
  void reserve_early_grads();
  // Elements [state, state + count) of the shard's reduced gradients (grads: where element 0
  // of the layout the step reads lies, on `device`), queued for download behind every kernel
  // issued so far, into the host copy (reserve_early_grads() first).
  void download_early_grads(const float* grads, Device device, int64_t state, int64_t count);
  // The step's clipping coefficient (1: none), applied to every chunk's gradients on the host.
  void scale_grads(float coefficient) { grad_scale_ = coefficient; }
  // At the start of each step: nothing has come down yet (and the scale is 1 again).
  void forget_early_grads();
  // Chunks that took their gradients from what came down early, since forget_early_grads().
  size_t early_chunks() const { return early_used_; }

  const std::vector<HostChunk>& chunks() const { return chunks_; }
  size_t staging_bytes() const { return staging_.capacity() + early_.capacity(); }

 private:
  std::vector<HostChunk> chunks_;
  int64_t slot_elements_ = 0;  // the largest chunk
  bool params_on_host_ = false;
  Arena staging_;  // 2 slots x (parameters, gradients), page-locked; params_on_host: gradients
  Arena early_;    // the shard's gradients brought down early (page-locked), at state offsets
  std::vector<char> came_early_;  // per chunk: its gradients are in early_
  float grad_scale_ = 1.0f;
  size_t early_used_ = 0;
  AsyncCopier down_, up_;
};

}  // namespace pentad
