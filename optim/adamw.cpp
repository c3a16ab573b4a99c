#include "optim/adamw.h"

#include <cmath>

#include "kernels/ops.h"

namespace pentad {

float learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps)
    return cfg.lr * static_cast<float>(step + 1) / static_cast<float>(cfg.warmup_steps);
  if (cfg.decay == "constant") return cfg.lr;
  const float min_lr = cfg.lr * cfg.min_lr_ratio;
  const int64_t decay_steps = total_steps - cfg.warmup_steps;
  if (decay_steps <= 0) return cfg.lr;
  const double ratio = std::min(1.0, static_cast<double>(step - cfg.warmup_steps) /
                                         static_cast<double>(decay_steps));
  double factor = cfg.decay == "linear" ? 1.0 - ratio : 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + factor * (cfg.lr - min_lr));
}

GradSquares grad_sum_squares(const ParamStore& params) {
  GradSquares sums;
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
    (params.spec(id).shard_dim >= 0 ? sums.sharded : sums.replicated) +=
        kernels::sum_squares(params.grad(id));
  return sums;
}

void clip_gradients(ParamStore& params, double norm, float max_norm) {
  if (max_norm <= 0.0f) return;
  const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
  if (coef < 1.0) kernels::scale(params.all_grads(), static_cast<float>(coef));
}

AdamW::AdamW(const OptimConfig& cfg, const ParamStore& params)
    : cfg_(cfg), m_("adam m", params.bytes()), v_("adam v", params.bytes()) {
  m_.zero();
  v_.zero();
}

void AdamW::reset() {
  m_.zero();
  v_.zero();
  step_ = 0;
}

void AdamW::step(ParamStore& params, float lr) {
  ++step_;
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    const float wd = params.spec(id).weight_decay ? cfg_.weight_decay : 0.0f;
    kernels::adamw_update(params.param(id), params.view(m_.base(), id), params.view(v_.base(), id),
                          params.grad(id), lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step_);
  }
}

}  // namespace pentad
