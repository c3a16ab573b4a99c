// The trainer's side of checkpoints: which state a snapshot holds, when it is committed,
// loading one (any layout) to resume, and restoring the newest from host memory. The
// format and the background saver live in checkpoint/.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/device_memory.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace pentad {

std::vector<Trainer::StateBuffer> Trainer::state_buffers(bool with_optimizer) const {
  std::vector<StateBuffer> buffers = {{"param/", model_->params().all_params().data}};
  if (with_optimizer) {
    buffers.push_back({"adam_m/", optimizer_->m_base()});
    buffers.push_back({"adam_v/", optimizer_->v_base()});
  }
  return buffers;
}

std::string Trainer::checkpoint_root() const {
  return cfg_.train.ckpt_dir.empty() ? cfg_.train.out_dir + "/checkpoints" : cfg_.train.ckpt_dir;
}

std::vector<std::string> Trainer::checkpoint_roots() const {
  std::vector<std::string> roots = {checkpoint_root()};
  if (!cfg_.train.ckpt_mirror.empty()) roots.push_back(cfg_.train.ckpt_mirror);
  return roots;
}

void Trainer::save(int64_t steps_done) {
  commit_pending(true);
  // The first data-parallel replica of each shard writes it; the others hold copies.
  // Copied in the optimizer's order (parameter by parameter: its value, m, v), so that the
  // optimizer can follow the copy (snapshot_copied()).
  std::vector<ckpt::LiveTensor> tensors;
  if (dp_rank_ == 0) {
    const ParamStore& p = model_->params();
    for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
      const ParamSpec& spec = p.spec(id);
      if (spec.shard_dim < 0 && model_->tp().rank() != 0) continue;  // tp rank 0 has it
      if (spec.pipeline_copy) continue;  // the first pipeline stage saves the original
      for (const StateBuffer& kind : state_buffers(true)) {
        ckpt::ShardInfo info{kind.prefix + spec.name, spec.global_shape, spec.shard_dim,
                             spec.shard_start, spec.local_shape, 0};
        tensors.push_back({info, p.view(kind.base, id, p.device()).f32(), p.device()});
      }
    }
  }
  std::vector<std::string> files;
  for (const std::string& root : checkpoint_roots())
    files.push_back(ckpt::partial_dir(root, steps_done) + "/" + ckpt::rank_file_name(world_rank_));
  saver_.begin(files, std::move(tensors), cfg_.train.async_save);  // after the step's kernels
  pending_save_ = steps_done;
  ++saves_;
  pending_optimizer_steps_ = optimizer_->steps_taken();
  snapshot_step_ = steps_done;
  snapshot_optimizer_steps_ = optimizer_->steps_taken();
}

AdamW::BeforeChunk Trainer::snapshot_copied() {
  if (!saver_.copying()) return {};
  std::vector<const float*> bases;  // what the optimizer overwrites
  for (const StateBuffer& b : state_buffers(true))
    bases.push_back(static_cast<const float*>(b.base));
  return [this, bases](size_t begin, size_t end) {
    for (const float* base : bases) saver_.wait_for_copy(base + begin, base + end);
  };
}

int64_t Trainer::restore_snapshot() {
  if (snapshot_step_ < 0) return -1;  // the same on every rank: save() is collective
  const bool restored = saver_.restore();
  if (all_ranks(restored ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("the snapshot of step {} is not in memory (its copy failed)", snapshot_step_);
    return -1;
  }
  ParamStore& p = model_->params();
  const Device device = p.device();
  // Data-parallel replicas take it from the first, which staged it ...
  if (dp_size_ > 1)
    for (const StateBuffer& b : state_buffers(true))
      mesh_->group(parallel::Axis::DP)
          .broadcast(view_of(b.base, Shape{p.numel()}, DType::F32, device), 0);
  // ... and tensor-parallel ranks their replicated parameters from tp rank 0.
  if (model_->tp().degree() > 1)
    for (const StateBuffer& b : state_buffers(true))
      for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
        if (p.spec(id).shard_dim < 0)
          mesh_->group(parallel::Axis::TP).broadcast(p.view(b.base, id, device), 0);
  // ... and the last pipeline stage its copy of the tied embedding from the first stage
  // (group rank 0), which staged the original.
  if (parallel::Communicator* ends = mesh_ ? mesh_->embedding_group() : nullptr)
    if (cfg_.model.tie_embeddings) {
      const int id = model_->embedding_copy() >= 0 ? model_->embedding_copy() : model_->embedding();
      for (const StateBuffer& b : state_buffers(true)) ends->broadcast(p.view(b.base, id, device), 0);
    }
  p.refresh_weights();  // the compute copy (bf16) follows the restored master values
  optimizer_->set_steps_taken(snapshot_optimizer_steps_);
  start_step_ = snapshot_step_;
  spdlog::info("restored the step {} snapshot from host memory", snapshot_step_);
  return snapshot_step_;
}

void Trainer::commit_pending(bool block) {
  if (pending_save_ < 0) return;
  if (block) saver_.wait_for_file();
  if (all_ranks(saver_.file_done() ? 1 : 0, parallel::ReduceOp::Min) == 0) return;  // later
  std::string error;
  try {
    saver_.wait_for_file();
  } catch (const Error& e) {
    error = e.what();
  }
  const int64_t step = pending_save_;
  pending_save_ = -1;
  if (all_ranks(error.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("checkpoint of step {} not committed ({}); the previous one stays the latest",
                 step, error.empty() ? "another rank failed to write" : error);
    return;
  }
  if (world_rank_ == 0) {
    ckpt::Manifest m;
    m.step = step;
    m.optimizer_steps = pending_optimizer_steps_;
    const parallel::MeshConfig* mc = mesh_ ? &mesh_->config() : nullptr;
    m.layout = ckpt::Layout{mesh_ ? mesh_->world_size() : 1, mc ? mc->tp : 1, mc ? mc->dp : 1,
                            mc ? mc->pp : 1, mc ? mc->cp : 1, model_->tp().sequence_parallel()};
    m.recipe_toml = recipe_to_toml(cfg_);
    saver_.wait_for_removal();  // commit() hands back any *.deleting it finds
    std::vector<std::string> retired;
    for (const std::string& root : checkpoint_roots()) {
      for (std::string& dir : ckpt::commit(root, m, static_cast<int>(cfg_.train.keep_last)))
        retired.push_back(std::move(dir));
      spdlog::info("checkpoint: step {} committed to {}", step, ckpt::checkpoint_dir(root, step));
    }
    saver_.remove_later(std::move(retired));  // off the training thread
  }
  if (mesh_) mesh_->world().barrier();  // nobody resumes from a checkpoint not yet visible
}

bool Trainer::load(const std::string& dir) {
  std::string error;
  int64_t step = 0, optimizer_steps = 0;
  try {
    ckpt::Reader reader(dir);
    step = reader.manifest().step;
    optimizer_steps = reader.manifest().optimizer_steps;
    ParamStore& p = model_->params();
    // A checkpoint imported from elsewhere may carry parameters only: the optimizer then
    // starts fresh.
    const bool with_optimizer = reader.has("adam_m/" + p.spec(0).name);
    if (!with_optimizer) {
      optimizer_->reset();
      optimizer_steps = 0;
    }
    std::vector<float> host;  // device state is read into host memory, then copied over
    for (const StateBuffer& kind : state_buffers(with_optimizer))
      for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
        const ParamSpec& spec = p.spec(id);
        const Tensor dst = p.view(kind.base, id, p.device());
        if (dst.device != Device::CPU) host.resize(static_cast<size_t>(dst.numel()));
        float* out = dst.device == Device::CPU ? dst.f32() : host.data();
        reader.read(kind.prefix + spec.name, spec.global_shape, spec.shard_dim, spec.shard_start,
                    spec.local_shape, out);
        if (dst.device != Device::CPU) copy_bytes(dst.data, dst.device, out, Device::CPU, dst.bytes());
      }
    p.refresh_weights();
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank must take the same checkpoint: one rank's failure sends all to the previous.
  if (all_ranks(error.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("cannot resume from {}: {}", dir, error.empty() ? "another rank failed to read it" : error);
    return false;
  }
  start_step_ = step;
  optimizer_->set_steps_taken(optimizer_steps);
  return true;
}

int64_t Trainer::resume(const std::string& which) {
  if (which != "latest") {
    if (!load(which)) fail("cannot resume from {} (see the warning above)", which);
    spdlog::info("resumed from {} at step {}", which, start_step_);
    return start_step_;
  }
  // Newest first in the local level, then the mirror (the local disk may be gone).
  for (const std::string& root : checkpoint_roots())
    for (const std::string& dir : ckpt::committed_checkpoints(root)) {
      if (load(dir)) {
        spdlog::info("resumed from {} at step {}", dir, start_step_);
        return start_step_;
      }
      spdlog::warn("falling back to the checkpoint before {}", dir);
    }
  spdlog::warn("no usable checkpoint in {}: starting from step 0", fmt::join(checkpoint_roots(), " or "));
  model_->params().initialize(cfg_.train.seed);  // undo what a failed load overwrote
  optimizer_->reset();
  return 0;
}

}  // namespace pentad
