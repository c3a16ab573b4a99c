// The checkpoint manager's snapshots and commits: which state a snapshot holds, save(), the
// optimizer step's side of a snapshot in flight, the commit of each save, and the reports.
#include "train/checkpoint_manager.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/device_memory.h"
#include "recipe/recipe.h"

namespace pentad {

CheckpointManager::CheckpointManager(Run run)
    : cfg_(run.cfg),
      mesh_(run.mesh),
      model_(run.model),
      optimizer_(run.optimizer),
      grad_sync_(run.grad_sync),
      embedding_id_(run.embedding_id),
      tokenizer_(run.tokenizer),
      first_sample_(std::move(run.first_sample)),
      continue_data_order_(std::move(run.continue_data_order)),
      settle_offloaded_shares_(std::move(run.settle_offloaded_shares)),
      write_metrics_(std::move(run.write_metrics)),
      memory_(ckpt::MemoryLevel::prefix_for(run.cfg.checkpoint.memory_dir, root(run.cfg.train),
                                            run.mesh ? run.mesh->world_rank() : 0)) {
  if (mesh_) {
    world_rank_ = mesh_->world_rank();
    dp_size_ = mesh_->degree(parallel::Axis::DP);
    dp_rank_ = mesh_->coord(parallel::Axis::DP);
    cp_size_ = mesh_->degree(parallel::Axis::CP);
    cp_rank_ = mesh_->coord(parallel::Axis::CP);
  }
  // "auto" is the copy: swap (direct I/O from the page-aligned arenas) measured equal to it
  // within noise and costs a second set of the state (bench/RESULTS.md, 2026-11-25).
  swap_snapshots_ = cfg_.checkpoint.snapshot == "swap";
  saver_.set_recycling(cfg_.checkpoint.recycle_files);
  committer_ = std::make_unique<CheckpointCommitter>(
      saver_, mesh_ ? &mesh_->world() : nullptr, world_rank_, cfg_.train, roots(cfg_.train),
      [this](int64_t step) { return checkpoint_record(step); },
      [this](int64_t step, const ckpt::AsyncSaver::Timings& timings) {
        report_saver_time(step, timings);
      });
  if (cfg_.train.save_every <= 0) return;  // restore_snapshot() needs a save() too
  if (swap_snapshots_) {
    model_.params().allocate_spare();
    optimizer_.allocate_spare();
  } else {
    saver_.reserve(snapshot_tensors());
  }
}

std::string CheckpointManager::root(const TrainConfig& train) {
  return train.ckpt_dir.empty() ? train.out_dir + "/checkpoints" : train.ckpt_dir;
}

std::vector<std::string> CheckpointManager::roots(const TrainConfig& train) {
  std::vector<std::string> roots = {root(train)};
  if (!train.ckpt_mirror.empty()) roots.push_back(train.ckpt_mirror);
  return roots;
}

std::vector<CheckpointManager::StateBuffer> CheckpointManager::state_buffers(
    bool with_optimizer) const {
  std::vector<StateBuffer> buffers = {{"param/", model_.params().all_params().data}};
  if (with_optimizer) {
    buffers.push_back({"adam_m/", optimizer_.m_base()});
    buffers.push_back({"adam_v/", optimizer_.v_base()});
  }
  return buffers;
}

std::vector<CheckpointManager::StatePart> CheckpointManager::state_parts(
    int id, bool with_optimizer) const {
  const ParamStore& p = model_.params();
  const ParamSpec& spec = p.spec(id);
  const ckpt::ShardInfo whole{
      "", spec.global_shape, spec.shard_dim,   spec.shard_start, spec.local_shape, 0,
      0,  spec.shard_dim2,   spec.shard_start2};
  std::vector<StatePart> parts;
  int tensor = 0;
  for (const StateBuffer& kind : state_buffers(with_optimizer)) {
    const bool moment = kind.base != p.all_params().data;
    // Moments offloaded to host memory (parallel.offload = "cpu") are host tensors.
    const Device device = moment ? optimizer_.state_device() : p.device();
    auto view = [&](int64_t at, const Shape& shape) {
      return kind.base ? view_of(static_cast<float*>(kind.base) + at, shape, DType::F32, device)
                       : Tensor{};
    };
    if (!moment && zero_stage() < 3) {  // parameters whole on every rank
      parts.push_back({whole, p.view(kind.base, id, p.device()), false, 0, 0});
      parts.back().info.name = kind.prefix + spec.name;
      continue;
    }
    // ZeRO-3 parameters, and moments: this rank's shares.
    for (const StateShard::Piece& piece : optimizer_.shard().pieces(spec)) {
      ckpt::ShardInfo info = whole;
      info.name = kind.prefix + spec.name;
      info.local_shape.dims[0] = piece.rows;
      info.row_start = piece.row_start;
      parts.push_back({info, view(moment ? piece.shard : piece.arena, info.local_shape), moment,
                       moment ? tensor : AdamW::kParamTensor, piece.shard,
                       moment ? optimizer_.offloaded() : optimizer_.params_offloaded()});
    }
    if (moment) ++tensor;
  }
  return parts;
}

bool CheckpointManager::writes(const ParamSpec& spec) const {
  auto first = [&](parallel::Axis axis) { return !mesh_ || mesh_->coord(axis) == 0; };
  if (spec.expert)
    return first(parallel::Axis::EDP) && (spec.shard_dim >= 0 || first(parallel::Axis::ETP));
  return dp_rank_ == 0 && cp_rank_ == 0 &&
         (spec.shard_dim >= 0 ? spec.tp_replica == 0 : model_.tp().rank() == 0);
}

std::vector<ckpt::LiveTensor> CheckpointManager::snapshot_tensors(
    std::vector<NvmeSlice>* on_nvme) const {
  // The first data-parallel replica of each shard writes it; the others hold copies.
  // Copied in the optimizer's order (parameter by parameter: its value, m, v), so that the
  // optimizer can follow the copy (snapshot_copied()).
  // MoE experts have their own replicas: the ranks of one edp group hold the same experts,
  // each etp rank a slice (and the whole of an etp-replicated bias).
  // With ZeRO every dp x cp rank writes the moments of its shares (at stage 3 the
  // parameters' too), and every edp rank the moments of its shares of the experts; of what
  // tp (etp) replicates, the first tp (etp) rank.
  std::vector<ckpt::LiveTensor> tensors;
  const ParamStore& p = model_.params();
  const bool etp_first = !mesh_ || mesh_->coord(parallel::Axis::ETP) == 0;
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    if (spec.pipeline_copy) continue;  // the first pipeline stage saves the original
    const bool share_writes = spec.shard_dim >= 0
                                  ? spec.tp_replica == 0
                                  : (spec.expert ? etp_first : model_.tp().rank() == 0);
    for (const StatePart& part : state_parts(id, true))
      if (((part.moment && zero_stage()) || zero_stage() == 3) ? share_writes : writes(spec)) {
        if (part.on_nvme && on_nvme)
          on_nvme->push_back(
              {tensors.size(), part.tensor, part.shard, part.info.local_shape.numel()});
        // Offloaded state is staged by stage_from_nvme() on the host (on CUDA too: the
        // saver must not copy it from the device).
        tensors.push_back({part.info, part.on_nvme ? nullptr : part.view.f32(),
                           part.on_nvme ? Device::CPU : part.view.device, part.on_nvme});
      }
  }
  return tensors;
}

void CheckpointManager::save(int64_t steps_done) {
  // The previous save committed (a commit in flight waited for): its retired files go to
  // the recycling pool before this save's files look there.
  commit_pending(true);
  std::vector<std::string> files;
  for (const std::string& root : roots(cfg_.train))
    files.push_back(ckpt::partial_dir(root, steps_done) + "/" + ckpt::rank_file_name(world_rank_));
  // After the step's kernels. A swap snapshot is frozen: the next optimizer step writes the
  // spare set, and this one stays as it is until the save after next.
  if (swap_snapshots_) {
    model_.params().allocate_spare();  // once; at start-up already when train.save_every > 0
    optimizer_.allocate_spare();
  }
  snapshot_on_nvme_.clear();
  std::vector<ckpt::LiveTensor> tensors = snapshot_tensors(&snapshot_on_nvme_);
  saver_.begin(files, std::move(tensors), cfg_.train.async_save, swap_snapshots_,
               [this](const std::vector<float*>& staged) { stage_from_nvme(staged); });
  swap_pending_ = swap_snapshots_;
  snapshot_in_spare_ = false;
  committer_->pending(steps_done);
  ++saves_;
  pending_optimizer_steps_ = optimizer_.steps_taken();
  snapshot_step_ = steps_done;
  snapshot_optimizer_steps_ = optimizer_.steps_taken();
}

size_t CheckpointManager::memory_level_bytes() const {
  if (cfg_.checkpoint.memory_every <= 0) return 0;  // allocated after the resume: computed
  return 2 * ckpt::AsyncSaver::staging_floats(snapshot_tensors()) * sizeof(float);
}

bool CheckpointManager::memory_due(int64_t steps_done) const {
  const int64_t every = cfg_.checkpoint.memory_every;
  return every > 0 && !memory_off_ && steps_done % every == 0;
}

void CheckpointManager::save_to_memory(int64_t steps_done) {
  ckpt::Manifest base = checkpoint_record(steps_done).base;
  base.optimizer_steps = optimizer_.steps_taken();
  try {
    memory_.take(base, snapshot_tensors(), cfg_.train.async_save);
    ++memory_snapshots_;
  } catch (const Error& e) {
    // The files go on; the level's next snapshot tries again.
    spdlog::warn("the in-memory snapshot of step {} was not taken: {}", steps_done, e.what());
  }
}

AdamW::BeforeChunk CheckpointManager::before_update() {
  // A copy in flight is followed chunk by chunk; a swap snapshot is left where it is.
  // Offloaded, the update follows no copy: the snapshot's parameters in memory (below
  // ZeRO-3) are copied whole first; the file's part was read inside save().
  if (optimizer_.offloaded()) {
    saver_.wait_for_copy();
    memory_.wait_for_copy();
    return {};
  }
  return snapshot_copied();
}

AdamW::BeforeChunk CheckpointManager::snapshot_copied() {
  // A step saves a file or takes an in-memory snapshot, not both: one copy to follow.
  if (!saver_.copying() && !memory_.copying()) return {};
  std::vector<const float*> bases;  // what the optimizer overwrites
  for (const StateBuffer& b : state_buffers(true))
    bases.push_back(static_cast<const float*>(b.base));
  return [this, bases](size_t begin, size_t end, size_t state_begin) {
    auto wait = [this](const float* from, const float* to) {
      saver_.wait_for_copy(from, to);
      memory_.wait_for_copy(from, to);
    };
    wait(bases[0] + begin, bases[0] + end);    // the parameters
    for (size_t i = 1; i < bases.size(); ++i)  // m and v
      wait(bases[i] + state_begin, bases[i] + state_begin + (end - begin));
  };
}

void CheckpointManager::updated() {
  if (swap_pending_) {
    swap_pending_ = false;
    snapshot_in_spare_ = true;
  }
}

void CheckpointManager::before_params_written() {
  const float* base = model_.params().all_params().f32();
  saver_.wait_for_copy(base, base + model_.params().numel());
  memory_.wait_for_copy(base, base + model_.params().numel());
}

void CheckpointManager::commit_pending(bool block) {
  committer_->commit_pending(block);
}

CheckpointCommitter::Record CheckpointManager::checkpoint_record(int64_t step) const {
  CheckpointCommitter::Record record;
  ckpt::Manifest& m = record.base;
  m.step = step;
  m.optimizer_steps = pending_optimizer_steps_;
  m.samples = first_sample_(step);
  const parallel::MeshConfig* mc = mesh_ ? &mesh_->config() : nullptr;
  m.layout = ckpt::Layout{mesh_ ? mesh_->world_size() : 1,
                          mc ? mc->tp : 1,
                          mc ? mc->dp : 1,
                          mc ? mc->pp : 1,
                          mc ? mc->cp : 1,
                          model_.tp().sequence_parallel()};
  m.recipe_toml = recipe_to_toml(cfg_);
  m.tokenizer_file = tokenizer_.file;
  m.tokenizer_sha256 = tokenizer_.sha256;
  record.tokenizer = tokenizer_.bytes;
  return record;
}

void CheckpointManager::live_step(int64_t step) {
  live_step_ = step;
  live_optimizer_steps_ = optimizer_.steps_taken();
}

bool CheckpointManager::survivors_possible() const {
  return cfg_.checkpoint.survivors && cfg_.train.save_every > 0 &&
         model_.params().device() == Device::CPU && optimizer_.state_device() == Device::CPU &&
         !optimizer_.offloaded() && !optimizer_.params_offloaded();
}

void CheckpointManager::count_survivor_tensors() {
  // Each tensor once: by the rank that writes its first shard (value, m and v).
  const ParamStore& p = model_.params();
  int first = 0;
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    if (!spec.pipeline_copy && writes(spec) && spec.shard_start == 0 && spec.shard_start2 == 0)
      first += 3;
  }
  survivor_tensors_ = all_ranks(first, parallel::ReduceOp::Sum);
}

void CheckpointManager::write_survivor_state(const std::string& tag) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::unique_lock<std::mutex> lock(state_mutex_, std::defer_lock);
  while (!lock.try_lock()) {
    if (seconds() > 0.5) {
      spdlog::warn("SIGTERM: no survivors' state written: the optimizer step was under way");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (live_step_ <= 0 || !survivors_possible()) return;
  std::vector<ckpt::ShardData> shards;
  const ParamStore& p = model_.params();
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
    if (!p.spec(id).pipeline_copy)
      for (const StatePart& part : state_parts(id, true))
        shards.push_back({part.info, part.view.f32()});
  CheckpointCommitter::Record record = checkpoint_record(live_step_);
  record.base.optimizer_steps = live_optimizer_steps_;
  record.base.tensors = survivor_tensors_;
  const std::string root = roots(cfg_.train).front();
  try {
    ckpt::write_survivor(
        root, world_rank_, tag, record.base, shards,
        record.tokenizer ? std::string_view(*record.tokenizer) : std::string_view());
  } catch (const Error& e) {
    spdlog::warn("SIGTERM: the survivors' state of step {} not written: {}", live_step_, e.what());
    return;
  }
  spdlog::info("SIGTERM: the survivors' state of step {} written to {} in {:.3f} s", live_step_,
               ckpt::survivors_dir(root, live_step_, tag), seconds());
}

void CheckpointManager::finish_run() {
  // Blocked time while training; the last snapshot's flush at exit is reported apart.
  const double blocked = blocked_seconds();
  commit_pending(true);
  if (saves_ > 0) report(blocked, blocked_seconds() - blocked);
  // The last checkpoint is on disk: the in-memory level's snapshots, all older (this run's,
  // or the one it resumed from), go.
  if (saves_ > 0) memory_.remove();
  // Survivors' states an earlier attempt left that were not adopted: older than the last
  // checkpoint now, they go (adopt_survivors).
  if (saves_ > 0 && world_rank_ == 0)
    for (const std::string& line : ckpt::adopt_survivors(roots(cfg_.train).front()))
      spdlog::info("{}", line);
  // <ckpt_dir>/recycled goes.
  if (!cfg_.checkpoint.recycle_files || saves_ == 0) return;
  saver_.wait_for_removal();            // the last retired files may still be moving into the pool
  if (mesh_) mesh_->world().barrier();  // and every rank's last file written
  if (world_rank_ != 0) return;
  std::error_code ec;  // a leftover costs disk space only
  for (const std::string& root : roots(cfg_.train))
    std::filesystem::remove_all(ckpt::recycle_dir(root), ec);
}

void CheckpointManager::report(double blocked_seconds, double final_flush_seconds) {
  write_metrics_(nlohmann::json{{"checkpoint_saves", saves_},
                                {"checkpoint_memory_snapshots", memory_snapshots_},
                                {"checkpoint_blocked_seconds", blocked_seconds},
                                {"checkpoint_final_flush_seconds", final_flush_seconds}});
  spdlog::info(
      "checkpoints: {} saves{}, training blocked {:.3f} s in all ({}), final flush {:.3f} s, {} "
      "files written over recycled ones",
      saves_,
      memory_snapshots_ ? fmt::format(" and {} in-memory snapshots", memory_snapshots_) : "",
      blocked_seconds, cfg_.train.async_save ? "asynchronous" : "synchronous", final_flush_seconds,
      saver_.recycled_files());
}

void CheckpointManager::report_saver_time(int64_t step, const ckpt::AsyncSaver::Timings& t) {
  // The background thread's wall and CPU seconds for this rank's save: the CPU time is what
  // it took from the compute threads where they share the cores (bench/checkpoint_bench.py).
  write_metrics_(nlohmann::json{{"saved_step", step},
                                {"saver_copy_seconds", t.copy_seconds},
                                {"saver_copy_cpu_seconds", t.copy_cpu_seconds},
                                {"saver_write_seconds", t.write_seconds},
                                {"saver_write_cpu_seconds", t.write_cpu_seconds}});
}

int CheckpointManager::all_ranks(int value, parallel::ReduceOp op) {
  if (mesh_) mesh_->world().all_reduce(view_of(&value, Shape{1}, DType::I32), op);
  return value;
}

}  // namespace pentad
