// The checkpoint manager's restore from host memory: the newest snapshot (the last save())
// back into the live state without reading disk, bitwise what a resume from its checkpoint
// loads. A swap snapshot swaps the state sets back; a copy is restored from the saver's
// staging on the ranks that staged it and broadcast to the replicas that did not.
#include <spdlog/spdlog.h>

#include "kernels/ops.h"
#include "train/checkpoint_manager.h"

namespace pentad {

int64_t CheckpointManager::restore_snapshot() {
  if (snapshot_step_ < 0) return -1;  // the same on every rank: save() is collective
  if (swap_snapshots_) {
    // Every rank holds its own frozen set: back to it, and the next step writes the other
    // set again, so the snapshot survives for another restore and its file's write.
    if (snapshot_in_spare_) {
      model_.params().swap_params();
      optimizer_.swap_state();
      snapshot_in_spare_ = false;
    }
    swap_pending_ = true;
    return restored_snapshot();
  }
  if (optimizer_.offloaded()) prepare_nvme_restore();
  const bool restored =
      saver_.restore([this](const std::vector<float*>& staged) { unstage_to_nvme(staged); });
  if (all_ranks(restored ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("the snapshot of step {} is not in memory (its copy failed)", snapshot_step_);
    return -1;
  }
  share_restored_state();
  return restored_snapshot();
}

void CheckpointManager::share_restored_state() {
  ParamStore& p = model_.params();
  // The moments' device differs from the parameters' when they are offloaded to the host.
  auto device_of = [&](const StateBuffer& b) {
    return b.base == p.all_params().data ? p.device() : optimizer_.state_device();
  };
  // Data- and context-parallel replicas take it from the first, which staged it ...
  const bool moe = cfg_.model.is_moe();
  const bool replicated = dp_size_ * cp_size_ > 1;
  // With ZeRO every rank staged the moments of its own shares (at stage 3 its parameters' too).
  if (replicated && !moe && zero_stage() < 3)
    for (const StateBuffer& b : state_buffers(!zero_stage()))
      mesh_->dp_cp().broadcast(view_of(b.base, Shape{p.numel()}, DType::F32, device_of(b)), 0);
  // ... (with MoE parameter by parameter: experts from their first edp and etp rank;
  // with ZeRO each rank staged its shares of the experts' moments (at stage 3 of their
  // values too), and those of an etp-replicated one come from the first etp rank) ...
  if (mesh_ && moe && zero_stage() < 3)
    for (const StateBuffer& b : state_buffers(!zero_stage()))
      for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
        const ParamSpec& spec = p.spec(id);
        const Tensor t = p.view(b.base, id, device_of(b));
        if (!spec.expert) {
          if (replicated) mesh_->dp_cp().broadcast(t, 0);
          continue;
        }
        if (mesh_->degree(parallel::Axis::EDP) > 1)
          mesh_->group(parallel::Axis::EDP).broadcast(t, 0);
        if (spec.shard_dim < 0 && mesh_->degree(parallel::Axis::ETP) > 1)
          mesh_->group(parallel::Axis::ETP).broadcast(t, 0);
      }
  if (mesh_ && moe && zero_stage() && mesh_->degree(parallel::Axis::ETP) > 1)
    for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
      if (p.spec(id).expert && p.spec(id).shard_dim < 0)
        for (const StatePart& part : state_parts(id, true))
          if (part.moment || zero_stage() == 3)
            mesh_->group(parallel::Axis::ETP).broadcast(part.view, 0);
  // ... and tensor-parallel ranks their replicated parameters from tp rank 0.
  if (model_.tp().degree() > 1)
    for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
      if (p.spec(id).shard_dim < 0 && !p.spec(id).expert)
        for (const StatePart& part : state_parts(id, true))
          mesh_->group(parallel::Axis::TP).broadcast(part.view, 0);
  // ... and the last pipeline stage its copy of the tied embedding from the first stage
  // (group rank 0), which staged the original (with ZeRO, shares cut alike on both).
  if (parallel::Communicator* ends = mesh_ ? mesh_->embedding_group() : nullptr)
    if (cfg_.model.tie_embeddings)
      for (const StatePart& part : state_parts(embedding_id_, true)) ends->broadcast(part.view, 0);
}

int64_t CheckpointManager::restored_snapshot() {
  // ZeRO-3: the snapshot's shares only, as a load leaves them. A swap snapshot goes back to
  // the set frozen at the save, where a unit prefetched and not yet used was still whole;
  // a copy writes the shares over whatever was gathered when the restore came.
  grad_sync_.release_params();
  kernels::refresh_weights(model_.params());  // the compute copy follows the master values
  optimizer_.set_steps_taken(snapshot_optimizer_steps_);
  spdlog::info("restored the step {} snapshot from host memory", snapshot_step_);
  return snapshot_step_;
}

}  // namespace pentad
