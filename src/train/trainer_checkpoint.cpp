// The trainer's side of checkpoints: which state a snapshot holds, when it is committed,
// loading one (any layout) to resume, and restoring the newest from host memory. The
// format and the background saver live in checkpoint/.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "parallel/activity.h"
#include "recipe/checkpoint_recipe.h"
#include "recipe/recipe.h"
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

std::vector<Trainer::StatePart> Trainer::state_parts(int id, bool with_optimizer) const {
  const ParamStore& p = model_->params();
  const ParamSpec& spec = p.spec(id);
  const ckpt::ShardInfo whole{
      "", spec.global_shape, spec.shard_dim,   spec.shard_start, spec.local_shape, 0,
      0,  spec.shard_dim2,   spec.shard_start2};
  std::vector<StatePart> parts;
  int tensor = 0;
  for (const StateBuffer& kind : state_buffers(with_optimizer)) {
    const bool moment = kind.base != p.all_params().data;
    // Moments offloaded to host memory (parallel.offload = "cpu") are host tensors.
    const Device device = moment ? optimizer_->state_device() : p.device();
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
    for (const StateShard::Piece& piece : optimizer_->shard().pieces(spec)) {
      ckpt::ShardInfo info = whole;
      info.name = kind.prefix + spec.name;
      info.local_shape.dims[0] = piece.rows;
      info.row_start = piece.row_start;
      parts.push_back({info, view(moment ? piece.shard : piece.arena, info.local_shape), moment,
                       moment ? tensor : AdamW::kParamTensor, piece.shard,
                       moment ? optimizer_->offloaded() : optimizer_->params_offloaded()});
    }
    if (moment) ++tensor;
  }
  return parts;
}

bool Trainer::writes(const ParamSpec& spec) const {
  auto first = [&](parallel::Axis axis) { return !mesh_ || mesh_->coord(axis) == 0; };
  if (spec.expert)
    return first(parallel::Axis::EDP) && (spec.shard_dim >= 0 || first(parallel::Axis::ETP));
  return dp_rank_ == 0 && cp_rank_ == 0 &&
         (spec.shard_dim >= 0 ? spec.tp_replica == 0 : model_->tp().rank() == 0);
}

std::vector<ckpt::LiveTensor> Trainer::snapshot_tensors(std::vector<NvmeSlice>* on_nvme) const {
  // The first data-parallel replica of each shard writes it; the others hold copies.
  // Copied in the optimizer's order (parameter by parameter: its value, m, v), so that the
  // optimizer can follow the copy (snapshot_copied()).
  // MoE experts have their own replicas: the ranks of one edp group hold the same experts,
  // each etp rank a slice (and the whole of an etp-replicated bias).
  // With ZeRO every dp x cp rank writes the moments of its shares (at stage 3 the
  // parameters' too), and every edp rank the moments of its shares of the experts; of what
  // tp (etp) replicates, the first tp (etp) rank.
  std::vector<ckpt::LiveTensor> tensors;
  const ParamStore& p = model_->params();
  const bool etp_first = !mesh_ || mesh_->coord(parallel::Axis::ETP) == 0;
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    if (spec.pipeline_copy) continue;  // the first pipeline stage saves the original
    const bool share_writes = spec.shard_dim >= 0
                                  ? spec.tp_replica == 0
                                  : (spec.expert ? etp_first : model_->tp().rank() == 0);
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

void Trainer::prepare_snapshots() {
  if (cfg_.train.save_every <= 0) return;  // restore_snapshot() needs a save() too
  if (swap_snapshots_) {
    model_->params().allocate_spare();
    optimizer_->allocate_spare();
  } else {
    saver_.reserve(snapshot_tensors());
  }
}

void Trainer::save(int64_t steps_done) {
  // The previous save committed (a commit in flight waited for): its retired files go to
  // the recycling pool before this save's files look there.
  commit_pending(true);
  std::vector<std::string> files;
  for (const std::string& root : checkpoint_roots())
    files.push_back(ckpt::partial_dir(root, steps_done) + "/" + ckpt::rank_file_name(world_rank_));
  // After the step's kernels. A swap snapshot is frozen: the next optimizer step writes the
  // spare set, and this one stays as it is until the save after next.
  if (swap_snapshots_) {
    model_->params().allocate_spare();  // once; at start-up already when train.save_every > 0
    optimizer_->allocate_spare();
  }
  snapshot_on_nvme_.clear();
  std::vector<ckpt::LiveTensor> tensors = snapshot_tensors(&snapshot_on_nvme_);
  saver_.begin(files, std::move(tensors), cfg_.train.async_save, swap_snapshots_,
               [this](const std::vector<float*>& staged) { stage_from_nvme(staged); });
  swap_pending_ = swap_snapshots_;
  snapshot_in_spare_ = false;
  committer_->pending(steps_done);
  ++saves_;
  pending_optimizer_steps_ = optimizer_->steps_taken();
  snapshot_step_ = steps_done;
  snapshot_optimizer_steps_ = optimizer_->steps_taken();
}

void Trainer::optimizer_step(float lr) {
  // A copy in flight is followed chunk by chunk; a swap snapshot is left where it is.
  ParamStore& p = model_->params();
  // Parameters on NVMe: a share read ahead for a unit the step did not reach must land
  // before the update rewrites the file.
  settle_offloaded_shares();
  // Offloaded, the update follows no copy: the snapshot's parameters in memory (below
  // ZeRO-3) are copied whole first; the file's part was read inside save().
  if (optimizer_->offloaded()) saver_.wait_for_copy();
  optimizer_->step(p, lr, optimizer_->offloaded() ? AdamW::BeforeChunk{} : snapshot_copied(),
                   swap_pending_, reduced_shares());
  if (swap_pending_) {
    swap_pending_ = false;
    snapshot_in_spare_ = true;
  }
  if (zero_stage()) {
    // The all-gather writes every parameter: a copy in flight must have them all first.
    if (saver_.copying()) {
      const float* base = p.all_params().f32();
      saver_.wait_for_copy(base, base + p.numel());
    }
    // Stage 1, 2: on every rank now; stage 3: when next used. MoE at stage 3: after the
    // bias update (finish_moe_step), which writes every rank's whole copy of the expert bias.
    if (zero_stage() < 3 || !cfg_.model.is_moe()) grad_sync_->gather_updated_params();
  }
  kernels::refresh_weights(p);  // the compute copy follows the new master values
}

AdamW::BeforeChunk Trainer::snapshot_copied() {
  if (!saver_.copying()) return {};
  std::vector<const float*> bases;  // what the optimizer overwrites
  for (const StateBuffer& b : state_buffers(true))
    bases.push_back(static_cast<const float*>(b.base));
  return [this, bases](size_t begin, size_t end, size_t state_begin) {
    saver_.wait_for_copy(bases[0] + begin, bases[0] + end);  // the parameters
    for (size_t i = 1; i < bases.size(); ++i)                // m and v
      saver_.wait_for_copy(bases[i] + state_begin, bases[i] + state_begin + (end - begin));
  };
}

int64_t Trainer::restore_snapshot() {
  if (snapshot_step_ < 0) return -1;  // the same on every rank: save() is collective
  if (swap_snapshots_) {
    // Every rank holds its own frozen set: back to it, and the next step writes the other
    // set again, so the snapshot survives for another restore and its file's write.
    if (snapshot_in_spare_) {
      model_->params().swap_params();
      optimizer_->swap_state();
      snapshot_in_spare_ = false;
    }
    swap_pending_ = true;
    return restored_snapshot();
  }
  if (optimizer_->offloaded()) prepare_nvme_restore();
  const bool restored =
      saver_.restore([this](const std::vector<float*>& staged) { unstage_to_nvme(staged); });
  if (all_ranks(restored ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("the snapshot of step {} is not in memory (its copy failed)", snapshot_step_);
    return -1;
  }
  ParamStore& p = model_->params();
  // The moments' device differs from the parameters' when they are offloaded to the host.
  auto device_of = [&](const StateBuffer& b) {
    return b.base == p.all_params().data ? p.device() : optimizer_->state_device();
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
  if (model_->tp().degree() > 1)
    for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
      if (p.spec(id).shard_dim < 0 && !p.spec(id).expert)
        for (const StatePart& part : state_parts(id, true))
          mesh_->group(parallel::Axis::TP).broadcast(part.view, 0);
  // ... and the last pipeline stage its copy of the tied embedding from the first stage
  // (group rank 0), which staged the original (with ZeRO, shares cut alike on both).
  if (parallel::Communicator* ends = mesh_ ? mesh_->embedding_group() : nullptr)
    if (cfg_.model.tie_embeddings)
      for (const StatePart& part : state_parts(embedding_id(), true)) ends->broadcast(part.view, 0);
  return restored_snapshot();
}

int64_t Trainer::restored_snapshot() {
  // ZeRO-3: the snapshot's shares only, as a load leaves them. A swap snapshot goes back to
  // the set frozen at the save, where a unit prefetched and not yet used was still whole;
  // a copy writes the shares over whatever was gathered when the restore came.
  if (zero_stage() == 3)
    for (parallel::GradReducer* r : zero_reducers()) r->release_all();
  kernels::refresh_weights(model_->params());  // the compute copy follows the master values
  optimizer_->set_steps_taken(snapshot_optimizer_steps_);
  start_step_ = snapshot_step_;
  spdlog::info("restored the step {} snapshot from host memory", snapshot_step_);
  return snapshot_step_;
}

void Trainer::check_same_model(const std::string& dir, const std::string& action,
                               bool log_changes) const {
  std::string recipe;
  try {
    recipe = ckpt::Reader(dir).manifest().recipe_toml;
  } catch (const Error&) {
    return;  // an unreadable manifest makes a corrupt checkpoint: load() says so
  }
  if (recipe.empty()) {
    spdlog::warn("{} records no recipe: its model cannot be checked against this one", dir);
    return;
  }
  const RecipeComparison changes = compare_recipes(cfg_, recipe);
  if (!changes.model.empty())
    fail(
        "cannot {} {}: it holds another model than this recipe's (nothing was loaded or "
        "written):{}\nset these keys to the checkpoint's values, or use another checkpoint "
        "directory (train.ckpt_dir) for this model",
        action, dir, describe_changes(changes.model));
  if (log_changes && !changes.other.empty())
    spdlog::info("{}: recipe keys changed since it was saved:{}", dir,
                 describe_changes(changes.other));
}

void Trainer::check_checkpoint_roots() {
  const std::string& resumed = cfg_.train.resume;
  for (const std::string& root : checkpoint_roots()) {
    // Whether the resume chose among this root's checkpoints, newest first (--resume latest,
    // or --resume <this root>): then those newer than the step it took did not load.
    std::error_code same_ec;
    const bool searched =
        resumed == "latest" || std::filesystem::equivalent(resumed, root, same_ec);
    const char* key = root == checkpoint_root() ? "train.ckpt_dir" : "train.ckpt_mirror";
    // Found now rather than at the first save, steps later.
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec || !std::filesystem::is_directory(root))
      fail("{} = {}: cannot create the checkpoint directory ({}); set it to a writable place", key,
           root, ec ? ec.message() : "not a directory");
    std::vector<std::string> dirs = ckpt::committed_checkpoints(root);
    const std::vector<std::string> lost = ckpt::checkpoints_without_manifest(root);
    if (dirs.empty() && lost.empty()) continue;
    // Same step numbers, and retention by step: a new run's saves would replace these or be
    // retired behind them.
    if (cfg_.train.resume.empty())
      fail(
          "{} holds checkpoints (newest {}) that this run did not resume: its saves would "
          "write over them. Pass --resume latest to continue them, or set {} to another "
          "directory (or move them away)",
          root, (dirs.empty() ? lost : dirs).front(), key);
    // Checkpoints past the resumed step would be replaced by this run's saves of the same
    // steps (and retention would count them as the newest): never touched in place.
    std::vector<std::string> newer;
    for (const std::vector<std::string>* list : {&std::as_const(dirs), &lost})
      for (const std::string& dir : *list)
        if (ckpt::checkpoint_step(dir).value_or(-1) > start_step_) newer.push_back(dir);
    if (!newer.empty() && !searched && !cfg_.train.retire_newer)
      fail(
          "--resume {} (step {}): {} holds newer checkpoints ({}) that this run's saves would "
          "replace; nothing was written. Set {} to another directory, or pass "
          "train.retire_newer=true to move them to {}/retired/ and train on from step {}",
          cfg_.train.resume, start_step_, root, fmt::join(newer, ", "), key, root, start_step_);
    const char* folder = searched ? "unloadable" : "retired";
    if (world_rank_ == 0)
      for (const std::string& dir : newer)
        spdlog::warn("{} is newer than step {}, which this run resumed: moved to {}", dir,
                     start_step_, ckpt::set_aside(dir, folder));
    all_ranks(0, parallel::ReduceOp::Max);  // every rank sees the moves before any save
    for (const std::string& dir : ckpt::committed_checkpoints(root))
      check_same_model(dir, "save beside", false);
  }
}

bool Trainer::load(const std::string& dir, bool with_optimizer) {
  std::string error;
  int64_t step = 0, optimizer_steps = 0;
  ckpt::Manifest manifest;
  try {
    ckpt::Reader reader(dir);
    manifest = reader.manifest();
    step = reader.manifest().step;
    optimizer_steps = reader.manifest().optimizer_steps;
    ParamStore& p = model_->params();
    // A checkpoint imported from elsewhere may carry parameters only: the optimizer then
    // starts fresh.
    const bool with_state = with_optimizer && reader.has("adam_m/" + p.spec(0).name);
    if (!with_state) {
      optimizer_->reset();
      optimizer_steps = 0;
    }
    std::vector<float> host;  // device state is read into host memory, then copied over
    for (int id = 0; id < static_cast<int>(p.specs().size()); ++id)
      for (const StatePart& part : state_parts(id, with_state)) {
        const ckpt::ShardInfo& i = part.info;
        if (part.on_nvme) {  // through host memory to the file (moments, ZeRO-3's shares)
          host.resize(static_cast<size_t>(i.local_shape.numel()));
          reader.read(i.name, i.global_shape, i.shard_dim, i.shard_start, i.local_shape,
                      host.data(), i.row_start, i.shard_dim2, i.shard_start2);
          optimizer_->write_state(part.tensor, part.shard, i.local_shape.numel(), host.data());
          continue;
        }
        const Tensor& dst = part.view;
        if (dst.device != Device::CPU) host.resize(static_cast<size_t>(dst.numel()));
        float* out = dst.device == Device::CPU ? dst.f32() : host.data();
        reader.read(i.name, i.global_shape, i.shard_dim, i.shard_start, i.local_shape, out,
                    i.row_start, i.shard_dim2, i.shard_start2);
        if (dst.device != Device::CPU)
          copy_bytes(dst.data, dst.device, out, Device::CPU, dst.bytes());
      }
    settle_offloaded_shares();  // units gathered before hold the old values
    kernels::refresh_weights(p);
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank must take the same checkpoint: one rank's failure sends all to the previous.
  if (all_ranks(error.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("cannot {} {}: {}", with_optimizer ? "resume from" : "initialize from", dir,
                 error.empty() ? "another rank failed to read it" : error);
    return false;
  }
  start_step_ = step;
  optimizer_->set_steps_taken(optimizer_steps);
  if (with_optimizer) continue_data_order(manifest, dir);
  return true;
}

int64_t Trainer::resume(const std::string& which) {
  // A root that holds checkpoints (no manifest.json of its own), as train.init_from takes:
  // its newest that loads, falling back past corrupt ones.
  if (which != "latest" && !std::filesystem::exists(which + "/manifest.json"))
    if (const std::vector<std::string> dirs = ckpt::committed_checkpoints(which); !dirs.empty()) {
      for (const std::string& dir : dirs) {
        check_same_model(dir, "resume from", true);
        if (load(dir, true)) {
          spdlog::info("resumed from {} at step {}", dir, start_step_);
          return start_step_;
        }
        spdlog::warn("falling back to the checkpoint before {}", dir);
      }
      fail("--resume {}: no checkpoint there loads (see the warnings above)", which);
    }
  if (which != "latest") {
    check_same_model(which, "resume from", true);
    if (!load(which, true)) fail("cannot resume from {} (see the warning above)", which);
    spdlog::info("resumed from {} at step {}", which, start_step_);
    return start_step_;
  }
  // Newest first over both levels (the local disk may be gone, or hold only older ones); at
  // one step the local level first.
  bool found = false;
  std::vector<std::pair<int64_t, std::string>> candidates;
  const std::vector<std::string> roots = checkpoint_roots();
  for (const std::string& root : roots) {
    for (const std::string& dir : ckpt::checkpoints_without_manifest(root)) {
      spdlog::warn("{} has no manifest.json (deleted or lost): it cannot be resumed", dir);
      found = true;
    }
    for (const std::string& dir : ckpt::committed_checkpoints(root))
      candidates.push_back({ckpt::checkpoint_step(dir).value_or(-1), dir});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [step, dir] : candidates) {
    found = true;
    check_same_model(dir, "resume from", true);
    if (load(dir, true)) {
      spdlog::info("resumed from {} at step {}", dir, start_step_);
      return start_step_;
    }
    spdlog::warn("falling back to the checkpoint before {}", dir);
  }
  // Training from step 0 would write over checkpoints that are damaged, not absent.
  if (found)
    fail(
        "no checkpoint in {} loads (see the warnings above); refusing to start from step 0 "
        "and write over them: move them away, or set train.ckpt_dir to another directory",
        fmt::join(checkpoint_roots(), " or "));
  // Said as a warning: a mistyped train.ckpt_dir would otherwise retrain from scratch
  // unnoticed. Under `pentad launch` a restart before the first save lands here too.
  spdlog::warn("--resume latest: no checkpoint found in {}: training starts from step 0",
               fmt::join(checkpoint_roots(), " or "));
  return 0;
}

void Trainer::init_from(const std::string& path) {
  if (path == "latest")  // --resume's word for this run's own ckpt_dir, which a new run
                         // (init_from starts one) would refuse to save beside
    fail(
        "train.init_from = latest: init_from takes a checkpoint directory or a root of them; "
        "to continue this run's checkpoints use --resume latest");
  // A checkpoint directory holds a manifest; a root holds checkpoint directories.
  const bool one = std::filesystem::exists(path + "/manifest.json");
  std::vector<std::string> dirs =
      one ? std::vector<std::string>{path} : ckpt::committed_checkpoints(path);
  if (!one)
    for (const std::string& dir : ckpt::checkpoints_without_manifest(path))
      spdlog::warn("{} has no manifest.json (deleted or lost): it cannot be loaded", dir);
  if (dirs.empty())
    fail(
        "train.init_from = {}: neither a checkpoint (no manifest.json) nor a directory holding "
        "committed checkpoints (step-<N>/manifest.json)",
        path);
  for (const std::string& dir : dirs) {
    check_same_model(dir, "initialize the weights from", true);
    if (load(dir, false)) {
      start_step_ = 0;
      optimizer_->set_steps_taken(0);
      spdlog::info("initialized the weights from {} (optimizer fresh, step 0)", dir);
      return;
    }
    if (!one) spdlog::warn("falling back to the checkpoint before {}", dir);
  }
  fail("train.init_from = {}: no checkpoint there loads (see the warnings above)", path);
}

}  // namespace pentad
