#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "train/recipe.h"

namespace pentad {

void set_compute_threads(int64_t threads) {
  int n = threads > 0 ? static_cast<int>(threads) : omp_get_num_procs();
  omp_set_num_threads(n);
}

Trainer::Trainer(const Config& cfg) : cfg_(cfg) {
  set_compute_threads(cfg.train.threads);
  const TrainConfig& t = cfg.train;
  data_ = std::make_unique<data::DataLoader>(
      data::DataLoader::open(cfg.data, t.seq_len, cfg.model.vocab_size, t.seed));
  model_ = std::make_unique<Model>(cfg.model, t.micro_batch, t.seq_len);
  model_->params().initialize(t.seed);
  optimizer_ = std::make_unique<AdamW>(cfg.optim, model_->params());
  inputs_.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets_.resize(inputs_.size());
}

void Trainer::fetch_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) const {
  const TrainConfig& t = cfg_.train;
  // The global batch of a step is a contiguous range of the sampler's order; micro-batch m
  // takes its m-th slice. Later layouts split the same range, so data never depends on them.
  const int64_t global_batch = t.micro_batch * t.grad_accum;
  inputs.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets.resize(inputs.size());
  data_->train_samples(step * global_batch + micro * t.micro_batch, t.micro_batch, inputs.data(),
                       targets.data());
}

StepStats Trainer::train_step(int64_t step, const std::function<void()>& after_backward) {
  const TrainConfig& t = cfg_.train;
  auto start = std::chrono::steady_clock::now();
  ParamStore& params = model_->params();
  params.zero_grads();
  const float dloss = 1.0f / static_cast<float>(t.micro_batch * t.seq_len * t.grad_accum);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
    fetch_batch(step, micro, inputs_, targets_);
    loss_sum += model_->forward(inputs_.data(), targets_.data(), dloss);
    model_->backward();
  }
  if (after_backward) after_backward();
  StepStats s;
  s.step = step;
  s.loss = static_cast<float>(loss_sum / static_cast<double>(t.grad_accum));
  s.grad_norm = std::sqrt(grad_sum_squares(params));
  clip_gradients(params, s.grad_norm, cfg_.optim.grad_clip);
  s.lr = learning_rate(cfg_.optim, step, t.steps);
  optimizer_->step(params, s.lr);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = static_cast<double>(t.micro_batch * t.seq_len * t.grad_accum);
  s.tokens_per_second = tokens / s.seconds;
  s.flops_per_second = model_->flops_per_micro_batch() * static_cast<double>(t.grad_accum) / s.seconds;
  return s;
}

float Trainer::evaluate() {
  const TrainConfig& t = cfg_.train;
  double sum = 0.0;
  for (int64_t i = 0; i < t.eval_batches; ++i) {
    data_->val_samples(i * t.micro_batch, t.micro_batch, inputs_.data(), targets_.data());
    sum += model_->forward(inputs_.data(), targets_.data(), 0.0f);
  }
  return static_cast<float>(sum / static_cast<double>(std::max<int64_t>(1, t.eval_batches)));
}

std::string Trainer::memory_plan() const {
  const ParamStore& p = model_->params();
  const size_t params = p.bytes(), grads = p.bytes(), optim = 2 * p.bytes();
  const size_t acts = model_->activation_bytes();
  return fmt::format(
      "memory plan (this rank): parameters {} ({} values) | gradients {} | AdamW state {} | "
      "activations {} (micro-batch {} x {}, recompute {}) | total {}",
      format_bytes(params), p.numel(), format_bytes(grads), format_bytes(optim), format_bytes(acts),
      cfg_.train.micro_batch, cfg_.train.seq_len, cfg_.model.recompute ? "on" : "off",
      format_bytes(params + grads + optim + acts));
}

void Trainer::write_metrics(const std::string& json_line) {
  metrics_ << json_line << '\n';
  metrics_.flush();
}

void Trainer::run() {
  const TrainConfig& t = cfg_.train;
  std::filesystem::create_directories(t.out_dir);
  metrics_.open(std::filesystem::path(t.out_dir) / "metrics.jsonl", std::ios::trunc);
  if (!metrics_) fail("cannot write {}/metrics.jsonl", t.out_dir);
  {
    std::ofstream recipe(std::filesystem::path(t.out_dir) / "recipe.toml");
    recipe << recipe_to_toml(cfg_);
  }
  spdlog::info("data: {}", data_->describe());
  spdlog::info("model: {} with {} layers, width {}, {} heads ({} kv), vocabulary {}: {} parameters",
               cfg_.model.family == ModelFamily::GPT2 ? "gpt2" : "llama", cfg_.model.n_layer,
               cfg_.model.d_model, cfg_.model.n_head, cfg_.model.kv_heads(), cfg_.model.vocab_size,
               model_->params().numel());
  spdlog::info("{}", memory_plan());
  spdlog::info("threads: {}", omp_get_max_threads());
  for (int64_t step = 0; step < t.steps; ++step) {
    StepStats s = train_step(step);
    if (!std::isfinite(s.loss)) fail("loss is {} at step {}: training diverged", s.loss, step);
    nlohmann::json j = {{"step", step + 1},        {"loss", s.loss},
                        {"lr", s.lr},              {"grad_norm", s.grad_norm},
                        {"seconds", s.seconds},    {"tokens_per_second", s.tokens_per_second},
                        {"flops_per_second", s.flops_per_second}};
    write_metrics(j.dump());
    if (t.log_every > 0 && ((step + 1) % t.log_every == 0 || step == 0 || step + 1 == t.steps))
      spdlog::info("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} GFLOP/s",
                   step + 1, t.steps, s.loss, s.lr, s.grad_norm, s.tokens_per_second,
                   s.flops_per_second / 1e9);
    if (t.eval_every > 0 && ((step + 1) % t.eval_every == 0 || step + 1 == t.steps)) {
      float val = evaluate();
      write_metrics(nlohmann::json{{"step", step + 1}, {"eval_loss", val}}.dump());
      spdlog::info("step {:>5}/{} | eval loss {:.4f}", step + 1, t.steps, val);
    }
  }
}

}  // namespace pentad
