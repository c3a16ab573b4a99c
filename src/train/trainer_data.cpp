// The data each step reads. The training order (data/dataset.h) is global: step t takes
// its samples [first_sample(t), first_sample(t) + global batch), and micro-batch m of
// data-parallel rank r the slice m * dp + r of them, so the set a step reads depends on
// the global batch alone, never on how it is cut. A checkpoint records the samples
// consumed, so a resume under another layout, or another global batch, continues the order
// sample for sample.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {

int64_t Trainer::global_batch() const {
  const TrainConfig& t = cfg_.train;
  return t.micro_batch * t.grad_accum * dp_size_;
}

void Trainer::fetch_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) const {
  const TrainConfig& t = cfg_.train;
  inputs.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets.resize(inputs.size());
  const int64_t first = first_sample(step) + (micro * dp_size_ + dp_rank_) * t.micro_batch;
  data_->train_samples(first, t.micro_batch, inputs.data(), targets.data());
  if (!samples_dir_.empty()) {
    std::lock_guard<std::mutex> lock(samples_read_mu_);
    samples_read_.push_back({step, first, t.micro_batch});
  }
  keep_local_tokens(inputs);
  keep_local_tokens(targets);
}

void Trainer::keep_local_tokens(std::vector<int32_t>& ids) const {
  if (cp_positions_.empty()) return;
  // In place: position p[j] >= j, so every read is at or after the rows written so far.
  const int64_t T = cfg_.train.seq_len, t = int64_t(cp_positions_.size());
  for (int64_t b = 0; b < cfg_.train.micro_batch; ++b)
    for (int64_t j = 0; j < t; ++j)
      ids[size_t(b * t + j)] = ids[size_t(b * T + cp_positions_[size_t(j)])];
  ids.resize(size_t(cfg_.train.micro_batch * t));
}

void Trainer::continue_data_order(const ckpt::Manifest& manifest, const std::string& dir) {
  // The global batch of the run that saved it: its recipe's micro_batch x grad_accum x dp
  // (0: unknown, a checkpoint without a recipe or with one this pentad cannot read).
  int64_t then = 0;
  try {
    if (!manifest.recipe_toml.empty()) {
      const Config saved = parse_recipe(manifest.recipe_toml, dir + "/manifest.json");
      then = saved.train.micro_batch * saved.train.grad_accum * manifest.layout.dp;
    }
  } catch (const Error&) {
  }
  const int64_t now = global_batch();
  data_step_ = manifest.step;
  // Before the manifest recorded it, the data position was the step times the global batch.
  data_samples_ = manifest.samples >= 0 ? manifest.samples : manifest.step * (then ? then : now);
  if (then == 0 || then == now) return;
  const TrainConfig& t = cfg_.train;
  const std::string batch = fmt::format("{} sequences (micro_batch {} x grad_accum {} x dp {})",
                                        now, t.micro_batch, t.grad_accum, dp_size_);
  if (t.global_batch > 0)
    spdlog::info(
        "the global batch is now {}, train.global_batch; it was {} when {} was saved; the data "
        "order continues at sample {}",
        batch, then, dir, data_samples_);
  else
    spdlog::warn(
        "the global batch is now {}; it was {} when {} was saved: set train.global_batch = {} "
        "to keep it",
        batch, then, dir, then);
}

void Trainer::write_sample_ids() const {
  if (mesh_ && (mesh_->coord(parallel::Axis::TP) != 0 || mesh_->coord(parallel::Axis::CP) != 0 ||
                mesh_->coord(parallel::Axis::PP) != 0))
    return;  // the replica's other ranks read the same samples
  std::filesystem::create_directories(samples_dir_);
  const std::string path = fmt::format("{}/dp{}.jsonl", samples_dir_, dp_rank_);
  std::ofstream out(path);
  std::lock_guard<std::mutex> lock(samples_read_mu_);
  // One line per step, its samples in the order read: {"step": 1, "samples": [4, 5, ...]}
  // (steps 1-based, as in metrics.jsonl).
  for (size_t i = 0; i < samples_read_.size();) {
    const int64_t step = samples_read_[i][0];
    std::string ids;
    for (; i < samples_read_.size() && samples_read_[i][0] == step; ++i)
      for (int64_t k = 0; k < samples_read_[i][2]; ++k)
        ids += fmt::format("{}{}", ids.empty() ? "" : ", ", samples_read_[i][1] + k);
    out << fmt::format("{{\"step\": {}, \"samples\": [{}]}}\n", step + 1, ids);
  }
  if (!out) fail("--dump-samples: cannot write {}", path);
}

}  // namespace pentad
