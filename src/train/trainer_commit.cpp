// The trainer's checkpoint commit: once every rank's file of a save is written, rank 0
// commits each level (manifest, rename, fsyncs) and the ranks agree on the outcome; the time
// this takes on the training thread counts as blocked. Retired files go to the saver's
// thread (removal, or the recycling pool).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "parallel/activity.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace pentad {

void Trainer::commit_pending(bool block) {
  if (pending_save_ < 0) return;
  struct Clock {  // counts this call's time, less the saver's waits (which it counts itself)
    Trainer& t;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    double saver_blocked = t.saver_.blocked_seconds();
    ~Clock() {
      t.commit_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
          (t.saver_.blocked_seconds() - saver_blocked);
    }
  } clock{*this};
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
  const int64_t step = pending_save_;
  pending_save_ = -1;
  // Each level (the local directory, the mirror) commits on its own: one that fails
  // (a full disk) costs the others nothing.
  const std::vector<std::string> roots = checkpoint_roots();
  const std::vector<std::string>& errors = saver_.file_errors();
  failed_saves_.resize(roots.size(), 0);
  std::vector<std::string> why(roots.size());
  std::vector<std::string> retired;
  for (size_t level = 0; level < roots.size(); ++level) {
    const std::string& mine = level < errors.size() ? errors[level] : std::string();
    if (!mine.empty() && world_rank_ != 0) spdlog::warn("checkpoint of step {}: {}", step, mine);
    bool failed = all_ranks(mine.empty() ? 0 : 1, parallel::ReduceOp::Max) != 0;
    why[level] = mine.empty() ? "another rank could not write its file, or rank 0 commit it "
                                "(see their messages)"
                              : mine;
    if (world_rank_ == 0) {
      if (!failed) {
        try {
          commit_level(roots[level], step, retired);
        } catch (const Error& e) {
          failed = true;
          why[level] = e.what();
        }
      }
      if (failed) {
        std::error_code ec;  // what the failed save left on the (full) disk goes
        std::filesystem::remove_all(ckpt::partial_dir(roots[level], step), ec);
      }
    }
    failed = all_ranks(failed ? 1 : 0, parallel::ReduceOp::Max) != 0;  // rank 0's commit too
    failed_saves_[level] = failed ? failed_saves_[level] + 1 : 0;
    if (failed && world_rank_ == 0)
      spdlog::warn(
          "checkpoint of step {} not committed to {} (failure {} in a row of at most "
          "train.max_failed_saves = {}): {}",
          step, roots[level], failed_saves_[level], cfg_.train.max_failed_saves, why[level]);
  }
  if (world_rank_ == 0) saver_.remove_later(std::move(retired));  // off the training thread
  if (failed_saves_[0] == 0)                                      // the local level committed
    parallel::activity_checkpoint_committed(step);
  if (mesh_) mesh_->world().barrier();  // nobody resumes from a checkpoint not yet visible
  for (size_t level = 0; level < roots.size(); ++level)
    if (failed_saves_[level] >= cfg_.train.max_failed_saves)
      fail(
          "stopping: {} consecutive checkpoints could not be saved to {} (train.max_failed_saves "
          "= {}), the last because {}; training on would leave the run unprotected. Free space "
          "there, or point train.ckpt_dir / train.ckpt_mirror elsewhere, then --resume latest",
          failed_saves_[level], roots[level], cfg_.train.max_failed_saves, why[level]);
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

void Trainer::commit_level(const std::string& root, int64_t step,
                           std::vector<std::string>& retired) {
  ckpt::Manifest m;
  m.step = step;
  m.optimizer_steps = pending_optimizer_steps_;
  const parallel::MeshConfig* mc = mesh_ ? &mesh_->config() : nullptr;
  m.layout = ckpt::Layout{mesh_ ? mesh_->world_size() : 1,
                          mc ? mc->tp : 1,
                          mc ? mc->dp : 1,
                          mc ? mc->pp : 1,
                          mc ? mc->cp : 1,
                          model_->tp().sequence_parallel()};
  m.recipe_toml = recipe_to_toml(cfg_);
  saver_.wait_for_removal();  // commit() hands back any *.deleting it finds
  for (std::string& dir : ckpt::commit(root, m, static_cast<int>(cfg_.train.keep_last)))
    retired.push_back(std::move(dir));
  spdlog::info("checkpoint: step {} committed to {}", step, ckpt::checkpoint_dir(root, step));
}

}  // namespace pentad
