#include "train/reference.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/npy.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {

void export_reference(const Config& cfg, const std::string& out_dir, int64_t steps,
                      const std::string& checkpoint) {
  namespace fs = std::filesystem;
  fs::create_directories(out_dir);
  Trainer trainer(cfg);
  if (!checkpoint.empty()) trainer.resume(checkpoint);
  Model& model = trainer.model();
  ParamStore& params = model.params();
  const int64_t b = cfg.train.micro_batch, t = cfg.train.seq_len;

  nlohmann::json manifest = {
      {"recipe", recipe_to_toml(cfg)}, {"steps", steps}, {"params", nlohmann::json::array()}};
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    const ParamSpec& spec = params.spec(id);
    std::vector<int64_t> shape(spec.global_shape.dims.begin(),
                               spec.global_shape.dims.begin() + spec.global_shape.ndim);
    manifest["params"].push_back(
        {{"name", spec.name}, {"shape", shape}, {"weight_decay", spec.weight_decay}});
    write_npy(out_dir + "/init." + spec.name + ".npy", params.param(id));
  }

  std::vector<int32_t> inputs, targets;
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t micro = 0; micro < cfg.train.grad_accum; ++micro) {
      trainer.fetch_batch(step, micro, inputs, targets);
      const std::string tag = std::to_string(step) + "." + std::to_string(micro);
      write_npy(out_dir + "/inputs." + tag + ".npy",
                view_of(inputs.data(), Shape{b, t}, DType::I32));
      write_npy(out_dir + "/targets." + tag + ".npy",
                view_of(targets.data(), Shape{b, t}, DType::I32));
    }

  // The first micro-batch's logits and loss, from a forward that keeps the logits.
  trainer.fetch_batch(0, 0, inputs, targets);
  float loss = model.forward(inputs.data(), targets.data(), 0.0f);
  write_npy(out_dir + "/logits.npy", model.logits().reshaped(Shape{b, t, cfg.model.vocab_size}));
  manifest["first_loss"] = loss;

  std::vector<float> losses;
  std::vector<double> moe_losses;  // (steps, 3): aux, seq_aux, z
  for (int64_t step = 0; step < steps; ++step) {
    auto dump_grads = [&] {
      if (step != 0) return;
      for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
        write_npy(out_dir + "/grad." + params.spec(id).name + ".npy", params.grad(id));
    };
    const StepStats s = trainer.train_step(step, dump_grads);
    losses.push_back(s.loss);
    moe_losses.insert(moe_losses.end(), {s.moe_aux, s.moe_seq_aux, s.moe_z});
  }
  write_npy(out_dir + "/losses.npy", view_of(losses.data(), Shape{steps}, DType::F32));
  if (cfg.model.is_moe()) {
    write_npy(out_dir + "/moe_losses.npy", view_of(moe_losses.data(), Shape{steps, 3}, DType::F64));
    // The expert biases after the last step's update (the sign rule, not AdamW).
    for (int id = 0; id < static_cast<int>(params.specs().size()); ++id)
      if (params.spec(id).name.ends_with(".moe.expert_bias"))
        write_npy(out_dir + "/final." + params.spec(id).name + ".npy", params.param(id));
  }
  std::ofstream(out_dir + "/manifest.json") << manifest.dump(2);
}

}  // namespace pentad
