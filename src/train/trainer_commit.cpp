// The trainer's side of the checkpoint commit (train/checkpoint_commit.h does the commit):
// what rank 0 records in each checkpoint's manifest, and the recycled files' removal at the
// end of a run.
#include <filesystem>

#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {

void Trainer::commit_pending(bool block) {
  committer_->commit_pending(block);
}

CheckpointCommitter::Record Trainer::checkpoint_record(int64_t step) const {
  CheckpointCommitter::Record record;
  ckpt::Manifest& m = record.base;
  m.step = step;
  m.optimizer_steps = pending_optimizer_steps_;
  m.samples = first_sample(step);
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
  record.tokenizer = tokenizer_.bytes;
  return record;
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
