// In-job restart from host memory: Trainer::restore_snapshot() gives back, bitwise, the
// state a resume from the same step's checkpoint on disk loads, and training continues
// exactly as it did the first time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {
namespace {

namespace fs = std::filesystem;

std::vector<float> params_of(Trainer& t) {
  const ParamStore& p = t.model().params();
  return std::vector<float>(p.all_params().f32(), p.all_params().f32() + p.numel());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// nvme: AdamW's state in a file (parallel.offload = "nvme"), which the snapshot reads at
// save() and the restore writes back.
void restore_equals_resume(bool nvme) {
  const fs::path out = fs::temp_directory_path() /
                       fmt::format("pentad-snapshot-{}{}", ::getpid(), nvme ? "-nvme" : "");
  fs::remove_all(out);
  std::vector<std::string> overrides = {"data.source=random", "train.steps=14",
                                        "train.threads=2",    "train.micro_batch=2",
                                        "train.seq_len=32",   "train.grad_accum=2",
                                        "train.eval_every=0", "train.out_dir=" + out.string()};
  if (nvme) {
    fs::create_directories(out / "nvme");
    for (std::string o : {"parallel.offload=nvme", "parallel.nvme_subgroup_kb=64",
                          "parallel.nvme_block_kb=16", "checkpoint.snapshot=copy"})
      overrides.push_back(o);
    overrides.push_back("parallel.offload_path=" + (out / "nvme").string());
  }
  const Config cfg =
      load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/llama-tiny.toml", overrides);
  constexpr int64_t kSaved = 8, kEnd = 12;
  std::vector<float> first, again, resumed, restored_params, final_params;
  {
    Trainer trainer(cfg);
    EXPECT_EQ(trainer.restore_snapshot(), -1);  // nothing saved yet
    for (int64_t s = 0; s < kSaved; ++s) trainer.train_step(s);
    trainer.save(kSaved);  // its copy overlaps the next step's forward and backward
    for (int64_t s = kSaved; s < kEnd; ++s) first.push_back(trainer.train_step(s).loss);
    trainer.commit_pending(true);
    ASSERT_EQ(trainer.restore_snapshot(), kSaved);
    restored_params = params_of(trainer);
    for (int64_t s = kSaved; s < kEnd; ++s) again.push_back(trainer.train_step(s).loss);
    final_params = params_of(trainer);
  }
  Trainer from_disk(cfg);
  ASSERT_EQ(from_disk.resume(ckpt::checkpoint_dir(from_disk.checkpoint_root(), kSaved)), kSaved);
  EXPECT_TRUE(same_bits(params_of(from_disk), restored_params));
  for (int64_t s = kSaved; s < kEnd; ++s) resumed.push_back(from_disk.train_step(s).loss);
  // Equal losses and weights after further steps: the moments and the step count (bias
  // correction) were restored too.
  EXPECT_TRUE(same_bits(again, first));
  EXPECT_TRUE(same_bits(resumed, first));
  EXPECT_TRUE(same_bits(params_of(from_disk), final_params));
  if (!::testing::Test::HasFailure()) fs::remove_all(out);
}

TEST(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDisk) {
  restore_equals_resume(false);
}

TEST(CheckpointSnapshot, RestoreOfNvmeOffloadedStateEqualsResumeFromDisk) {
  restore_equals_resume(true);
}

// A run that saves every step: each commit runs on rank 0's commit thread while the next
// step trains and the next file is written (TSan runs this test). Every save is committed
// in order, train.keep_last retires the older ones, and the newest resumes.
TEST(CheckpointSnapshot, CommitsInTheBackgroundKeepEverySaveInOrder) {
  const fs::path out = fs::temp_directory_path() / fmt::format("pentad-commits-{}", ::getpid());
  fs::remove_all(out);
  const Config cfg =
      load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/llama-tiny.toml",
                  {"data.source=random", "train.steps=6", "train.threads=2", "train.micro_batch=2",
                   "train.seq_len=32", "train.eval_every=0", "train.save_every=1",
                   "train.keep_last=2", "train.out_dir=" + out.string()});
  std::vector<float> params;
  {
    Trainer trainer(cfg);
    trainer.run();
    params = params_of(trainer);
  }
  Trainer again(cfg);
  const std::vector<std::string> kept = ckpt::committed_checkpoints(again.checkpoint_root());
  ASSERT_EQ(kept.size(), 2u);  // newest first
  EXPECT_EQ(kept[0], ckpt::checkpoint_dir(again.checkpoint_root(), 6));
  EXPECT_EQ(kept[1], ckpt::checkpoint_dir(again.checkpoint_root(), 5));
  ASSERT_EQ(again.resume("latest"), 6);
  EXPECT_TRUE(same_bits(params_of(again), params));
  if (!::testing::Test::HasFailure()) fs::remove_all(out);
}

}  // namespace
}  // namespace pentad
