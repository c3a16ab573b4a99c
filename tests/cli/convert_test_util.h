#pragma once
// What the sources of cli_tests' converter checks share (convert_test.cpp: the export to
// Hugging Face and llm.c; convert_import_test.cpp: the round trips and the import): tiny
// recipes, a checkpoint of random parameters written as the trainer writes one, and the
// comparisons.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/model.h"
#include "recipe/recipe.h"

namespace pentad::convert_test_util {

namespace fs = std::filesystem;
using namespace pentad::ckpt;

inline std::string fresh_dir(const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("pentad_convert_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

inline Config tiny(ModelFamily family, bool tied, int64_t n_kv_head = 0) {
  Config c = parse_recipe("", "test");
  c.model.family = family;
  c.model.n_layer = 2;
  c.model.d_model = 8;
  c.model.n_head = 2;
  c.model.n_kv_head = n_kv_head;
  c.model.d_ff = family == ModelFamily::LLaMA ? 12 : 0;
  c.model.vocab_size = 24;
  c.model.max_seq_len = 16;
  c.model.norm_eps = 1e-6f;
  if (family == ModelFamily::LLaMA) c.model.rope_theta = 500000.0f;  // unused by gpt2
  c.model.tie_embeddings = tied;
  c.train.seq_len = 16;
  return parse_recipe(recipe_to_toml(c), "test");  // validated
}

// An MoE llama of Mixtral's shape: experts in every layer, GQA, experts of their own width.
inline Config tiny_mixtral(bool tied) {
  Config c = tiny(ModelFamily::LLaMA, tied, 1);
  c.model.d_ff = 0;  // no dense MLP: import leaves the dense width at its default
  c.model.moe_layers = "all";
  c.model.n_experts = 3;
  c.model.top_k = 2;
  c.model.d_ff_expert = 6;
  c.model.moe.aux_loss_coef = 0.01f;
  return parse_recipe(recipe_to_toml(c), "test");
}

// The parameters of `cfg` as build_params names them, filled with random values (norms and
// biases too, so a mix-up between any two tensors shows).
struct Params {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<float>> values;
};

inline Params random_params(const Config& cfg, uint32_t seed) {
  Model model(cfg.model, 1, 1);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Params p;
  for (const ParamSpec& s : model.params().specs()) {
    p.names.push_back(s.name);
    p.shapes.push_back(s.global_shape);
    std::vector<float> v(static_cast<size_t>(s.global_shape.numel()));
    // The aux-loss-free selection bias stays zero, as Mixtral export requires (and as a
    // model trained without moe.bias_update_rate keeps it).
    if (!s.name.ends_with(".moe.expert_bias"))
      for (float& x : v) x = normal(rng);
    p.values.push_back(std::move(v));
  }
  return p;
}

inline std::string write_checkpoint(const std::string& root, const Config& cfg, const Params& p,
                                    int64_t step) {
  std::vector<ShardData> shards;
  for (size_t i = 0; i < p.names.size(); ++i) {
    ShardData s;
    s.info.name = "param/" + p.names[i];
    s.info.global_shape = p.shapes[i];
    s.info.local_shape = p.shapes[i];
    s.data = p.values[i].data();
    shards.push_back(s);
  }
  write_rank_file(partial_dir(root, step) + "/" + rank_file_name(0), shards);
  Manifest m;
  m.step = step;
  m.recipe_toml = recipe_to_toml(cfg);
  remove_dirs(commit(root, m, 0));
  return checkpoint_dir(root, step);
}

// Every parameter in dir equals p bit for bit, and dir holds nothing else.
inline void expect_same_params(const std::string& dir, const Params& p) {
  Reader r(dir);
  EXPECT_EQ(r.tensor_names().size(), p.names.size());
  for (size_t i = 0; i < p.names.size(); ++i) {
    std::vector<float> got(p.values[i].size());
    r.read("param/" + p.names[i], p.shapes[i], -1, 0, p.shapes[i], got.data());
    EXPECT_EQ(std::memcmp(got.data(), p.values[i].data(), got.size() * sizeof(float)), 0)
        << p.names[i];
  }
}

inline const std::vector<float>& value(const Params& p, const std::string& name) {
  for (size_t i = 0; i < p.names.size(); ++i)
    if (p.names[i] == name) return p.values[i];
  ADD_FAILURE() << "no parameter " << name;
  return p.values[0];
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace pentad::convert_test_util
