#include "train/checkpoint_commit.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "parallel/activity.h"

namespace pentad {
namespace {

// Adds the seconds of its scope to `total`, less the saver's own waits (counted apart); the
// fault monitor hears of the scope as the checkpoint's (parallel/activity.h).
struct BlockedClock {
  double& total;
  const ckpt::AsyncSaver& saver;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double saver_blocked = saver.blocked_seconds();
  BlockedClock(double& total_, const ckpt::AsyncSaver& saver_) : total(total_), saver(saver_) {
    parallel::activity_checkpoint_wait_begin();
  }
  BlockedClock(const BlockedClock&) = delete;
  BlockedClock& operator=(const BlockedClock&) = delete;
  ~BlockedClock() {
    parallel::activity_checkpoint_wait_end();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
             (saver.blocked_seconds() - saver_blocked);
  }
};

}  // namespace

CheckpointCommitter::CheckpointCommitter(ckpt::AsyncSaver& saver, parallel::Communicator* world,
                                         int world_rank, const TrainConfig& train,
                                         std::vector<std::string> roots, Describe describe,
                                         FilesWritten files_written)
    : saver_(saver),
      world_(world),
      world_rank_(world_rank),
      train_(train),
      roots_(std::move(roots)),
      describe_(std::move(describe)),
      files_written_(std::move(files_written)) {}

int CheckpointCommitter::all_ranks(int value, parallel::ReduceOp op) {
  if (world_) world_->all_reduce(view_of(&value, Shape{1}, DType::I32), op);
  return value;
}

void CheckpointCommitter::commit_pending(bool block) {
  conclude();  // the previous commit has had a step at least
  start(block);
  if (block) conclude();
}

void CheckpointCommitter::start(bool block) {
  if (pending_save_ < 0) return;
  BlockedClock clock{seconds_, saver_};
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
  conclude();  // one commit in flight at a time
  files_written_(pending_save_, saver_.last_timings());
  Job job;
  job.step = pending_save_;
  pending_save_ = -1;
  // Each level (the local directory, the mirror) commits on its own: one that fails
  // (a full disk) costs the others nothing.
  const std::vector<std::string>& errors = saver_.file_errors();
  for (size_t level = 0; level < roots_.size(); ++level) {
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
    Record record = describe_(job.step);
    saver_.wait_for_removal();  // commit() hands back any *.deleting it finds
    job.outcome = std::async(std::launch::async, &CheckpointCommitter::commit_levels, roots_,
                             std::move(record.base), static_cast<int>(train_.keep_last),
                             job.file_errors, record.tokenizer);
  }
  committing_ = std::move(job);
}

CheckpointCommitter::Outcome CheckpointCommitter::commit_levels(
    const std::vector<std::string>& roots, const ckpt::Manifest& base, int keep_last,
    const std::vector<std::string>& file_errors, std::shared_ptr<const std::string> tokenizer) {
  Outcome out;
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

void CheckpointCommitter::conclude() {
  if (!committing_) return;
  BlockedClock clock{seconds_, saver_};
  Job job = std::move(*committing_);
  committing_.reset();
  Outcome out = job.outcome.valid() ? job.outcome.get() : Outcome{};  // rank 0
  failed_saves_.resize(roots_.size(), 0);
  first_failed_at_.resize(roots_.size());
  committed_step_.resize(roots_.size(), -1);
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> why = job.file_errors;
  for (size_t level = 0; level < roots_.size(); ++level) {
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
          job.step, roots_[level], failed_saves_[level],
          std::chrono::duration<double>(now - first_failed_at_[level]).count(),
          train_.max_failed_saves, train_.failed_save_grace_s, why[level]);
  }
  if (world_rank_ == 0) saver_.remove_later(std::move(out.retired));  // off the training thread
  if (failed_saves_[0] == 0)                                          // the local level committed
    parallel::activity_checkpoint_committed(job.step);
  if (world_) world_->barrier();  // nobody resumes from a checkpoint not yet visible
  stop_if_failing(why, now);
}

void CheckpointCommitter::stop_if_failing(const std::vector<std::string>& why,
                                          std::chrono::steady_clock::time_point now) {
  const double grace_s = train_.failed_save_grace_s;
  for (size_t level = 0; level < roots_.size(); ++level) {
    if (failed_saves_[level] < train_.max_failed_saves) continue;
    const double seconds = std::chrono::duration<double>(now - first_failed_at_[level]).count();
    // Within the grace the run trains on while the level's newest committed checkpoint stands
    // (a resume has it) and the newest snapshot is in memory (a commit follows a save). Every
    // rank takes rank 0's word: its clock and what it sees of the directory.
    int tolerated = 0;
    if (world_rank_ == 0 && seconds < grace_s) {
      const std::vector<std::string> committed = ckpt::committed_checkpoints(roots_[level]);
      const std::string newest = committed_step_[level] >= 0
                                     ? ckpt::checkpoint_dir(roots_[level], committed_step_[level])
                                     : std::string();
      tolerated = !committed.empty() && (newest.empty() || committed.front() == newest);
      if (tolerated && failed_saves_[level] == train_.max_failed_saves)  // once a row
        spdlog::warn(
            "training on: {} still holds {}, and {:.0f} s of train.failed_save_grace_s "
            "are left",
            roots_[level], std::filesystem::path(committed.front()).filename().string(),
            grace_s - seconds);
    }
    if (all_ranks(tolerated, parallel::ReduceOp::Max) != 0) continue;
    throw SavesFailed(
        fmt::format(
            "stopping: {} consecutive checkpoints could not be saved to {} over {:.1f} s "
            "(train.max_failed_saves = {}, train.failed_save_grace_s = {}), the last because {}; "
            "training on would leave the run unprotected. Free space there, or point "
            "train.ckpt_dir / train.ckpt_mirror elsewhere, then --resume latest",
            failed_saves_[level], roots_[level], seconds, train_.max_failed_saves, grace_s,
            why[level]),
        roots_[level]);
  }
}

}  // namespace pentad
