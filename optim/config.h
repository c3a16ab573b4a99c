#pragma once
// The [optim] section of a recipe: AdamW and its learning-rate schedule.
#include <cstdint>
#include <string>

namespace pentad {

struct OptimConfig {  // [optim]
  float lr = 6e-4f;
  float min_lr_ratio = 0.1f;  // final lr = lr * min_lr_ratio
  int64_t warmup_steps = 10;
  std::string decay = "cosine";  // "cosine" | "linear" | "constant"
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // global-norm clip; 0 disables
};

}  // namespace pentad
