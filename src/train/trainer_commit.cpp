// The trainer's checkpoint commit. Once every rank's file of a save is written, rank 0
// commits each level (manifest, renames, fsyncs) on a thread of its own, so that the
// training thread never waits for the file system; the ranks agree on the outcome at the
// next commit_pending() (a step later at the earliest) or conclude_commit(). The time either
// takes on the training thread counts as blocked. Retired files go to the saver's thread
// (removal, or the recycling pool).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "parallel/activity.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {
namespace {

// Adds the seconds of its scope to `total`, less the saver's own waits (counted apart).
struct BlockedClock {
  double& total;
  const ckpt::AsyncSaver& saver;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double saver_blocked = saver.blocked_seconds();
  ~BlockedClock() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
             (saver.blocked_seconds() - saver_blocked);
  }
};

}  // namespace

void Trainer::commit_pending(bool block) {
  conclude_commit();  // the previous commit has had a step at least
  start_commit(block);
  if (block) conclude_commit();
}

void Trainer::start_commit(bool block) {
  if (pending_save_ < 0) return;
  BlockedClock clock{commit_seconds_, saver_};
  if (block) {
    try {
      saver_.wait_for_file();
    } catch (const Error&) {
      // file_errors() below says which level failed.
    }
  }
  if (all_ranks(saver_.file_done() ? 1 : 0, parallel::ReduceOp::Min) == 0) return;  // later
  try {
    saver_.wait_for_file();
  } catch (const Error&) {
  }
  conclude_commit();  // one commit in flight at a time
  report_saver_time(pending_save_, saver_.last_timings());
  CommitJob job;
  job.step = pending_save_;
  pending_save_ = -1;
  // Each level (the local directory, the mirror) commits on its own: one that fails
  // (a full disk) costs the others nothing.
  const std::vector<std::string> roots = checkpoint_roots();
  const std::vector<std::string>& errors = saver_.file_errors();
  for (size_t level = 0; level < roots.size(); ++level) {
    const std::string& mine = level < errors.size() ? errors[level] : std::string();
    if (!mine.empty() && world_rank_ != 0)
      spdlog::warn("checkpoint of step {}: {}", job.step, mine);
    const bool failed = all_ranks(mine.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0;
    job.file_errors.push_back(!failed        ? std::string()
                              : mine.empty() ? "another rank could not write its file (see its "
                                               "messages)"
                                             : mine);
  }
  if (world_rank_ == 0) {
    ckpt::Manifest m;
    m.step = job.step;
    m.optimizer_steps = pending_optimizer_steps_;
    m.samples = first_sample(job.step);
    const parallel::MeshConfig* mc = mesh_ ? &mesh_->config() : nullptr;
    m.layout = ckpt::Layout{mesh_ ? mesh_->world_size() : 1,
                            mc ? mc->tp : 1,
                            mc ? mc->dp : 1,
                            mc ? mc->pp : 1,
                            mc ? mc->cp : 1,
                            model_->tp().sequence_parallel()};
    m.recipe_toml = recipe_to_toml(cfg_);
    m.tokenizer_file = tokenizer_.file;
    m.tokenizer_sha256 = tokenizer_.sha256;
    saver_.wait_for_removal();  // commit() hands back any *.deleting it finds
    job.outcome =
        std::async(std::launch::async, &Trainer::commit_levels, roots, std::move(m),
                   static_cast<int>(cfg_.train.keep_last), job.file_errors, tokenizer_.bytes);
  }
  committing_ = std::move(job);
}

Trainer::CommitOutcome Trainer::commit_levels(const std::vector<std::string>& roots,
                                              const ckpt::Manifest& base, int keep_last,
                                              const std::vector<std::string>& file_errors,
                                              std::shared_ptr<const std::string> tokenizer) {
  CommitOutcome out;
  out.errors.resize(roots.size());
  for (size_t level = 0; level < roots.size(); ++level) {
    if (file_errors[level].empty()) {
      try {
        for (std::string& dir : ckpt::commit(roots[level], base, keep_last,
                                             tokenizer ? *tokenizer : std::string_view()))
          out.retired.push_back(std::move(dir));
        spdlog::info("checkpoint: step {} committed to {}", base.step,
                     ckpt::checkpoint_dir(roots[level], base.step));
        continue;
      } catch (const std::exception& e) {
        out.errors[level] = e.what();
      }
    }
    std::error_code ec;  // what the failed save left on the (full) disk goes
    std::filesystem::remove_all(ckpt::partial_dir(roots[level], base.step), ec);
  }
  return out;
}

void Trainer::conclude_commit() {
  if (!committing_) return;
  BlockedClock clock{commit_seconds_, saver_};
  CommitJob job = std::move(*committing_);
  committing_.reset();
  CommitOutcome out = job.outcome.valid() ? job.outcome.get() : CommitOutcome{};  // rank 0
  const std::vector<std::string> roots = checkpoint_roots();
  failed_saves_.resize(roots.size(), 0);
  first_failed_at_.resize(roots.size());
  committed_step_.resize(roots.size(), -1);
  const auto now = std::chrono::steady_clock::now();
  const double grace_s = cfg_.train.failed_save_grace_s;
  std::vector<std::string> why = job.file_errors;
  for (size_t level = 0; level < roots.size(); ++level) {
    const std::string commit_error = level < out.errors.size() ? out.errors[level] : "";
    if (why[level].empty() && !commit_error.empty()) why[level] = commit_error;
    const bool failed = all_ranks(why[level].empty() ? 0 : 1, parallel::ReduceOp::Max) != 0;
    if (failed && why[level].empty()) why[level] = "rank 0 could not commit it (see its messages)";
    failed_saves_[level] = failed ? failed_saves_[level] + 1 : 0;
    if (failed_saves_[level] == 1) first_failed_at_[level] = now;
    if (!failed) committed_step_[level] = job.step;
    if (failed && world_rank_ == 0)
      spdlog::warn(
          "checkpoint of step {} not committed to {} (failure {} in a row, the first {:.1f} s "
          "ago; the run stops after train.max_failed_saves = {} once train.failed_save_grace_s "
          "= {} s have passed): {}",
          job.step, roots[level], failed_saves_[level],
          std::chrono::duration<double>(now - first_failed_at_[level]).count(),
          cfg_.train.max_failed_saves, grace_s, why[level]);
  }
  if (world_rank_ == 0) saver_.remove_later(std::move(out.retired));  // off the training thread
  if (failed_saves_[0] == 0)                                          // the local level committed
    parallel::activity_checkpoint_committed(job.step);
  if (mesh_) mesh_->world().barrier();  // nobody resumes from a checkpoint not yet visible
  for (size_t level = 0; level < roots.size(); ++level) {
    if (failed_saves_[level] < cfg_.train.max_failed_saves) continue;
    const double seconds = std::chrono::duration<double>(now - first_failed_at_[level]).count();
    // Within the grace the run trains on while the level's newest committed checkpoint stands
    // (a resume has it) and the newest snapshot is in memory. Every rank takes rank 0's word:
    // its clock and what it sees of the directory.
    int tolerated = 0;
    if (world_rank_ == 0 && seconds < grace_s && snapshot_step_ >= 0) {
      const std::vector<std::string> committed = ckpt::committed_checkpoints(roots[level]);
      const std::string newest = committed_step_[level] >= 0
                                     ? ckpt::checkpoint_dir(roots[level], committed_step_[level])
                                     : std::string();
      tolerated = !committed.empty() && (newest.empty() || committed.front() == newest);
      if (tolerated && failed_saves_[level] == cfg_.train.max_failed_saves)  // once a row
        spdlog::warn(
            "training on: {} still holds {}, and {:.0f} s of train.failed_save_grace_s "
            "are left",
            roots[level], std::filesystem::path(committed.front()).filename().string(),
            grace_s - seconds);
    }
    if (all_ranks(tolerated, parallel::ReduceOp::Max) != 0) continue;
    throw SavesFailed(
        fmt::format(
            "stopping: {} consecutive checkpoints could not be saved to {} over {:.1f} s "
            "(train.max_failed_saves = {}, train.failed_save_grace_s = {}), the last because {}; "
            "training on would leave the run unprotected. Free space there, or point "
            "train.ckpt_dir / train.ckpt_mirror elsewhere, then --resume latest",
            failed_saves_[level], roots[level], seconds, cfg_.train.max_failed_saves, grace_s,
            why[level]),
        roots[level]);
  }
}

void Trainer::drop_recycled_files() {
  if (!cfg_.checkpoint.recycle_files || saves_ == 0) return;
  saver_.wait_for_removal();            // the last retired files may still be moving into the pool
  if (mesh_) mesh_->world().barrier();  // and every rank's last file written
  if (world_rank_ != 0) return;
  std::error_code ec;  // a leftover costs disk space only
  for (const std::string& root : checkpoint_roots())
    std::filesystem::remove_all(ckpt::recycle_dir(root), ec);
}

}  // namespace pentad
