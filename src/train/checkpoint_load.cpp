// The checkpoint manager's loads: resume (a checkpoint of any layout into this rank's
// shards, falling back past corrupt ones), init_from (the weights only), and the checks that
// refuse a checkpoint of another model or roots whose checkpoints this run's saves would
// write over.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "recipe/checkpoint_recipe.h"
#include "recipe/recipe.h"
#include "train/checkpoint_manager.h"
#include "train/metrics_log.h"

namespace pentad {

void CheckpointManager::check_same_model(const std::string& dir, const std::string& action,
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

void CheckpointManager::check_roots(int64_t resumed_step) {
  const std::string& resumed = cfg_.train.resume;
  for (const std::string& root : roots(cfg_.train)) {
    // Whether the resume chose among this root's checkpoints, newest first (--resume latest,
    // or --resume <this root>): then those newer than the step it took did not load.
    std::error_code same_ec;
    const bool searched =
        resumed == "latest" || std::filesystem::equivalent(resumed, root, same_ec);
    const char* key =
        root == CheckpointManager::root(cfg_.train) ? "train.ckpt_dir" : "train.ckpt_mirror";
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
        if (ckpt::checkpoint_step(dir).value_or(-1) > resumed_step) newer.push_back(dir);
    if (!newer.empty() && !searched && !cfg_.train.retire_newer)
      fail(
          "--resume {} (step {}): {} holds newer checkpoints ({}) that this run's saves would "
          "replace; nothing was written. Set {} to another directory, or pass "
          "train.retire_newer=true to move them to {}/retired/ and train on from step {}",
          cfg_.train.resume, resumed_step, root, fmt::join(newer, ", "), key, root, resumed_step);
    const char* folder = searched ? "unloadable" : "retired";
    if (world_rank_ == 0)
      for (const std::string& dir : newer)
        spdlog::warn("{} is newer than step {}, which this run resumed: moved to {}", dir,
                     resumed_step, ckpt::set_aside(dir, folder));
    all_ranks(0, parallel::ReduceOp::Max);  // every rank sees the moves before any save
    for (const std::string& dir : ckpt::committed_checkpoints(root))
      check_same_model(dir, "save beside", false);
  }
  check_memory_level(resumed_step, resumed == "latest");
}

std::optional<int64_t> CheckpointManager::load(const std::string& dir, bool with_optimizer) {
  std::string error;
  int64_t step = 0, optimizer_steps = 0;
  ckpt::Manifest manifest;
  try {
    ckpt::Reader reader(dir);
    manifest = reader.manifest();
    step = reader.manifest().step;
    optimizer_steps = reader.manifest().optimizer_steps;
    ParamStore& p = model_.params();
    // A checkpoint imported from elsewhere may carry parameters only: the optimizer then
    // starts fresh.
    const bool with_state = with_optimizer && reader.has("adam_m/" + p.spec(0).name);
    if (!with_state) {
      optimizer_.reset();
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
          optimizer_.write_state(part.tensor, part.shard, i.local_shape.numel(), host.data());
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
    settle_offloaded_shares_();  // units gathered before hold the old values
    kernels::refresh_weights(p);
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank must take the same checkpoint: one rank's failure sends all to the previous.
  if (all_ranks(error.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0) {
    spdlog::warn("cannot {} {}: {}", with_optimizer ? "resume from" : "initialize from", dir,
                 error.empty() ? "another rank failed to read it" : error);
    return std::nullopt;
  }
  optimizer_.set_steps_taken(optimizer_steps);
  if (with_optimizer) continue_data_order_(manifest, dir);
  return step;
}

int64_t CheckpointManager::resume(const std::string& which) {
  // A root that holds checkpoints (no manifest.json of its own), as train.init_from takes:
  // its newest that loads, falling back past corrupt ones.
  if (which != "latest" && !std::filesystem::exists(which + "/manifest.json"))
    if (const std::vector<std::string> dirs = ckpt::committed_checkpoints(which); !dirs.empty()) {
      for (const std::string& dir : dirs) {
        check_same_model(dir, "resume from", true);
        if (const std::optional<int64_t> step = load(dir, true)) {
          spdlog::info("resumed from {} at step {}", dir, *step);
          return *step;
        }
        spdlog::warn("falling back to the checkpoint before {}", dir);
      }
      fail("--resume {}: no checkpoint there loads (see the warnings above)", which);
    }
  if (which != "latest") {
    check_same_model(which, "resume from", true);
    const std::optional<int64_t> step = load(which, true);
    if (!step) fail("cannot resume from {} (see the warning above)", which);
    spdlog::info("resumed from {} at step {}", which, *step);
    return *step;
  }
  // The survivors' state a job ended by SIGTERM left (survivor_save.h), where it holds
  // everything and is newer than the newest checkpoint and than the last step logged: a
  // committed checkpoint first.
  if (world_rank_ == 0)
    for (const std::string& line :
         ckpt::adopt_survivors(roots(cfg_.train).front(), last_logged_step(cfg_.train.out_dir)))
      spdlog::info("--resume latest: {}", line);
  all_ranks(0, parallel::ReduceOp::Max);  // every rank sees what was adopted
  // Newest first over both levels (the local disk may be gone, or hold only older ones); at
  // one step the local level first.
  bool found = false;
  std::vector<std::pair<int64_t, std::string>> candidates;
  for (const std::string& root : roots(cfg_.train)) {
    for (const std::string& dir : ckpt::checkpoints_without_manifest(root)) {
      spdlog::warn("{} has no manifest.json (deleted or lost): it cannot be resumed", dir);
      found = true;
    }
    for (const std::string& dir : ckpt::committed_checkpoints(root))
      candidates.push_back({ckpt::checkpoint_step(dir).value_or(-1), dir});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // The in-memory level, where it holds a newer step of this layout than any file.
  if (const std::optional<int64_t> step =
          resume_from_memory(candidates.empty() ? -1 : candidates.front().first))
    return *step;
  for (const auto& [step, dir] : candidates) {
    found = true;
    check_same_model(dir, "resume from", true);
    if (const std::optional<int64_t> step = load(dir, true)) {
      spdlog::info("resumed from {} at step {}", dir, *step);
      return *step;
    }
    spdlog::warn("falling back to the checkpoint before {}", dir);
  }
  // Training from step 0 would write over checkpoints that are damaged, not absent.
  if (found)
    fail(
        "no checkpoint in {} loads (see the warnings above); refusing to start from step 0 "
        "and write over them: move them away, or set train.ckpt_dir to another directory",
        fmt::join(roots(cfg_.train), " or "));
  // Said as a warning: a mistyped train.ckpt_dir would otherwise retrain from scratch
  // unnoticed. Under `pentad launch` a restart before the first save lands here too.
  spdlog::warn("--resume latest: no checkpoint found in {}: training starts from step 0",
               fmt::join(roots(cfg_.train), " or "));
  return 0;
}

int64_t CheckpointManager::all_ranks64(int64_t value, parallel::ReduceOp op) {
  double v = static_cast<double>(value);  // exact: steps are far below 2^53
  if (mesh_) mesh_->world().all_reduce(view_of(&v, Shape{1}, DType::F64), op);
  return static_cast<int64_t>(v);
}

int64_t CheckpointManager::common_memory_step(const std::vector<ckpt::MemoryLevel::Held>& held,
                                              int64_t bound) {
  // Each rank's slots alternate in step, but a process that died mid-copy may hold one step
  // fewer than the others: the newest step at or below bound (< 0: none) of every rank's.
  if (bound < 0) bound = int64_t{1} << 52;
  for (;;) {
    int64_t mine = -1;
    for (const auto& h : held)
      if (h.manifest.step <= bound) mine = std::max(mine, h.manifest.step);
    const int64_t common = all_ranks64(mine, parallel::ReduceOp::Min);
    if (common < 0) return -1;
    const bool have = std::any_of(held.begin(), held.end(),
                                  [&](const auto& h) { return h.manifest.step == common; });
    if (all_ranks(have ? 0 : 1, parallel::ReduceOp::Max) == 0) return common;
    bound = common - 1;
  }
}

std::optional<int64_t> CheckpointManager::resume_from_memory(int64_t newer_than) {
  // This rank's complete snapshots that this run can take: its tensors, its model.
  const std::vector<ckpt::LiveTensor> tensors = snapshot_tensors();
  auto same_tensors = [&](const ckpt::Manifest& m) {
    if (!ckpt::MemoryLevel::holds(m, tensors)) return false;
    try {
      return compare_recipes(cfg_, m.recipe_toml).model.empty();
    } catch (const Error&) {
      return false;
    }
  };
  std::vector<ckpt::MemoryLevel::Held> usable;
  for (ckpt::MemoryLevel::Held& h : memory_.held())
    if (same_tensors(h.manifest)) usable.push_back(std::move(h));
  // Not past the run's log: a snapshot of step N starts before rank 0 writes N's loss, and a
  // resume from it would leave step N without one (as the survivors' state, adopt_survivors).
  const int64_t logged = world_rank_ == 0 ? last_logged_step(cfg_.train.out_dir) : -1;
  int64_t bound = all_ranks64(logged, parallel::ReduceOp::Max), step = -1;
  std::vector<ckpt::MemoryLevel::Held>::const_iterator held;
  for (;;) {  // newest first; a damaged one falls back to the other slot, then to the files
    step = common_memory_step(usable, bound);
    if (step < 0 || step <= newer_than) return std::nullopt;  // the same on every rank
    held = std::find_if(usable.begin(), usable.end(),
                        [&](const auto& h) { return h.manifest.step == step; });
    std::string error;
    try {
      memory_.load(held->slot, tensors);
    } catch (const Error& e) {
      error = e.what();
    }
    if (all_ranks(error.empty() ? 0 : 1, parallel::ReduceOp::Max) == 0) break;
    spdlog::warn("cannot resume from the in-memory snapshot of step {}: {}", step,
                 error.empty() ? "another rank failed to read its own" : error);
    bound = step - 1;
  }
  memory_.resumed_from(held->slot);
  share_restored_state();
  grad_sync_.release_params();
  kernels::refresh_weights(model_.params());
  optimizer_.set_steps_taken(held->manifest.optimizer_steps);
  continue_data_order_(held->manifest, memory_.data_file(held->slot));
  resumed_from_memory_ = true;
  spdlog::info("resumed from the in-memory snapshot of step {} ({}), newer than {}", step,
               memory_.data_file(held->slot),
               newer_than < 0 ? std::string("any checkpoint file")
                              : fmt::format("the newest checkpoint file (step {})", newer_than));
  return step;
}

void CheckpointManager::check_memory_level(int64_t resumed_step, bool searched) {
  // Snapshots earlier processes left that are newer than what this run resumed (damaged,
  // past the log, or any where this run resumed nothing), or of another layout: this run's
  // own would write over them, so they are refused or set aside as newer files are. Of this
  // layout, a step counts where every rank holds it (one only some hold, the others having
  // died before its copy was whole, is no snapshot of the job); of another, whatever a rank
  // holds (its job's other ranks are not this one's to ask).
  const std::vector<ckpt::LiveTensor> tensors = snapshot_tensors();
  if (!resumed_from_memory_) {
    const bool fresh = cfg_.train.resume.empty();
    const int64_t after = fresh ? -1 : resumed_step;
    std::vector<ckpt::MemoryLevel::Held> same;
    int64_t other = -1;
    for (ckpt::MemoryLevel::Held& h : memory_.held())
      if (ckpt::MemoryLevel::holds(h.manifest, tensors))
        same.push_back(std::move(h));
      else if (h.manifest.step > after)
        other = std::max(other, h.manifest.step);
    const int64_t complete = common_memory_step(same, -1);  // the same on every rank
    const int64_t own = std::max(other, complete > after ? complete : -1);
    // Rank 0: the slots of ranks past this job's (a job of more ranks ran before), each with
    // its newest step.
    std::vector<std::pair<std::string, int64_t>> beyond;
    int64_t past = -1;
    if (world_rank_ == 0)
      for (const std::string& prefix : ckpt::MemoryLevel::prefixes_from_rank(
               memory_.prefix(), mesh_ ? mesh_->world_size() : 1)) {
        const std::vector<ckpt::MemoryLevel::Held> held = ckpt::MemoryLevel(prefix).held();
        beyond.push_back({prefix, held.empty() ? -1 : held.front().manifest.step});
        if (beyond.back().second > after) past = std::max(past, beyond.back().second);
      }
    const int64_t newest = all_ranks64(std::max(own, past), parallel::ReduceOp::Max);
    if (newest >= 0) {
      const std::string files = memory_.prefix().substr(0, memory_.prefix().rfind("-rank-") + 1);
      if (fresh)
        fail(
            "in-memory snapshots of an earlier run of train.ckpt_dir = {} (newest step {}) are "
            "in {}: this run's would write over them. Pass --resume latest to continue from "
            "them, or delete {}* (on every machine of the job)",
            root(cfg_.train), newest, cfg_.checkpoint.memory_dir, files);
      if (!searched && !cfg_.train.retire_newer)
        fail(
            "--resume {} (step {}): the in-memory level holds a newer snapshot (step {}, {}*) "
            "that this run's snapshots would replace; nothing was written. Pass --resume "
            "latest, or train.retire_newer=true to set it aside and train on from step {}",
            cfg_.train.resume, resumed_step, newest, files, resumed_step);
    }
    const char* suffix = searched ? "unloadable" : "retired";
    auto set_aside = [&](ckpt::MemoryLevel& level, int64_t step) {
      for (const std::string& moved : level.set_aside(suffix))
        spdlog::warn(
            "the in-memory snapshot {} (step {}) is newer than step {}, which this run "
            "resumed, or of another layout: moved to {} (delete it to free its memory)",
            moved.substr(0, moved.rfind('.')), step, resumed_step, moved);
    };
    if (own >= 0) set_aside(memory_, own);
    // Those of ranks past this job's: newer ones set aside as their job's other ranks' are,
    // older ones (no state this run lacks) deleted.
    for (const auto& [prefix, step] : beyond) {
      ckpt::MemoryLevel level(prefix);
      if (step > after)
        set_aside(level, step);
      else
        level.remove();
    }
  }
  if (cfg_.checkpoint.memory_every <= 0) return;
  try {
    memory_.reserve(tensors);
  } catch (const Error& e) {
    // A full tmpfs (snapshots set aside by earlier restarts, another job's) costs the level,
    // not the run: the files protect it as without one.
    memory_off_ = true;
    spdlog::warn("checkpoint.memory_every = {}: the in-memory level is off for this run: {}",
                 cfg_.checkpoint.memory_every, e.what());
  }
}

void CheckpointManager::init_from(const std::string& path) {
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
      optimizer_.set_steps_taken(0);
      spdlog::info("initialized the weights from {} (optimizer fresh, step 0)", dir);
      return;
    }
    if (!one) spdlog::warn("falling back to the checkpoint before {}", dir);
  }
  fail("train.init_from = {}: no checkpoint there loads (see the warnings above)", path);
}

}  // namespace pentad
