#pragma once
// The training loop: one flat step (micro-batches -> gradient clipping -> AdamW), eval
// every N steps, one log line per step and every metric as JSONL.
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/config.h"

namespace pentad {

struct StepStats {
  int64_t step = 0;
  float loss = 0.0f;       // mean over the global batch's tokens
  float lr = 0.0f;
  double grad_norm = 0.0;  // before clipping
  double seconds = 0.0;
  double tokens_per_second = 0.0;
  double flops_per_second = 0.0;
};

class Trainer {
 public:
  explicit Trainer(const Config& cfg);

  // One optimizer step on the global batch of `step`. after_backward (optional) sees the
  // accumulated gradients before clipping and the optimizer.
  StepStats train_step(int64_t step, const std::function<void()>& after_backward = {});
  // Mean loss over eval_batches micro-batches of the validation stream.
  float evaluate();
  // The whole run: prints the memory plan, trains cfg.train.steps steps, logs, evaluates.
  void run();

  Model& model() { return *model_; }
  const Config& config() const { return cfg_; }
  // The micro-batch `micro` of step `step`: (b, t) inputs and targets from the data loader.
  void fetch_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) const;
  std::string memory_plan() const;

 private:
  void write_metrics(const std::string& json_line);

  Config cfg_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<data::DataLoader> data_;
  std::ofstream metrics_;
  std::vector<int32_t> inputs_, targets_;
};

// Sets the number of compute threads (0 = every core) for OpenMP and OpenBLAS.
void set_compute_threads(int64_t threads);

}  // namespace pentad
