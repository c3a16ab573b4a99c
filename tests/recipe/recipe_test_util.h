#pragma once
// What the sources of recipe_tests' recipe checks share (recipe_test.cpp: shipped recipes,
// overrides, defaults and the round trip; recipe_mistakes_test.cpp: the table of mistakes):
// recipes written to a temporary directory, the field-by-field comparison of two Configs,
// and the shipped recipes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace pentad::recipe_test_util {

namespace fs = std::filesystem;

// A fresh directory per test program for recipes the tests write; removed at exit.
inline fs::path temp_dir() {
  struct Dir {
    fs::path path;
    Dir() : path(fs::temp_directory_path() / ("pentad_recipe_test_" + std::to_string(getpid()))) {
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline std::string write_recipe(const std::string& name, const std::string& text) {
  fs::path path = temp_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

// Field-by-field, floats by bit pattern: "round trip" means exactly the same Config.
inline void expect_same(const Config& a, const Config& b) {
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  EXPECT_EQ(a.model.family, b.model.family);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.d_model, b.model.d_model);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_kv_head, b.model.n_kv_head);
  EXPECT_EQ(a.model.d_ff, b.model.d_ff);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(bits(a.model.norm_eps), bits(b.model.norm_eps));
  EXPECT_EQ(bits(a.model.rope_theta), bits(b.model.rope_theta));
  EXPECT_EQ(bits(a.model.init_std), bits(b.model.init_std));
  EXPECT_EQ(a.model.tie_embeddings, b.model.tie_embeddings);
  EXPECT_EQ(a.model.recompute, b.model.recompute);
  EXPECT_EQ(a.model.moe_layers, b.model.moe_layers);
  EXPECT_EQ(a.model.n_experts, b.model.n_experts);
  EXPECT_EQ(a.model.top_k, b.model.top_k);
  EXPECT_EQ(a.model.d_ff_expert, b.model.d_ff_expert);
  EXPECT_EQ(a.model.n_shared_experts, b.model.n_shared_experts);
  EXPECT_EQ(a.model.moe.score, b.model.moe.score);
  EXPECT_EQ(a.model.moe.renormalize, b.model.moe.renormalize);
  EXPECT_EQ(bits(a.model.moe.aux_loss_coef), bits(b.model.moe.aux_loss_coef));
  EXPECT_EQ(bits(a.model.moe.seq_aux_loss_coef), bits(b.model.moe.seq_aux_loss_coef));
  EXPECT_EQ(bits(a.model.moe.z_loss_coef), bits(b.model.moe.z_loss_coef));
  EXPECT_EQ(bits(a.model.moe.bias_update_rate), bits(b.model.moe.bias_update_rate));
  EXPECT_EQ(bits(a.model.moe.capacity_factor), bits(b.model.moe.capacity_factor));
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.parallel.etp, b.parallel.etp);
  EXPECT_EQ(bits(a.optim.lr), bits(b.optim.lr));
  EXPECT_EQ(bits(a.optim.min_lr_ratio), bits(b.optim.min_lr_ratio));
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.decay, b.optim.decay);
  EXPECT_EQ(bits(a.optim.beta1), bits(b.optim.beta1));
  EXPECT_EQ(bits(a.optim.beta2), bits(b.optim.beta2));
  EXPECT_EQ(bits(a.optim.eps), bits(b.optim.eps));
  EXPECT_EQ(bits(a.optim.weight_decay), bits(b.optim.weight_decay));
  EXPECT_EQ(bits(a.optim.grad_clip), bits(b.optim.grad_clip));
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.micro_batch, b.train.micro_batch);
  EXPECT_EQ(a.train.seq_len, b.train.seq_len);
  EXPECT_EQ(a.train.grad_accum, b.train.grad_accum);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.eval_every, b.train.eval_every);
  EXPECT_EQ(a.train.eval_batches, b.train.eval_batches);
  EXPECT_EQ(a.train.log_every, b.train.log_every);
  EXPECT_EQ(a.train.threads, b.train.threads);
  EXPECT_EQ(a.train.out_dir, b.train.out_dir);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.val_path, b.data.val_path);
  EXPECT_EQ(bits(a.data.val_fraction), bits(b.data.val_fraction));
  EXPECT_EQ(a.data.tokenizer, b.data.tokenizer);
  EXPECT_EQ(a.data.cache_dir, b.data.cache_dir);
}

inline std::vector<fs::path> shipped_recipes() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(fs::path(PENTAD_SOURCE_DIR) / "recipes"))
    if (entry.path().extension() == ".toml") paths.push_back(entry.path());
  return paths;
}

inline Config load_shipped(const std::string& name,
                           const std::vector<std::string>& overrides = {}) {
  return load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/" + name + ".toml", overrides);
}

}  // namespace pentad::recipe_test_util
