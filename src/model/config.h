#pragma once
// The [model] section of a recipe: the architecture (src/train/recipe.cpp fills it).
#include <cstdint>

namespace pentad {

enum class ModelFamily { GPT2, LLaMA };

struct ModelConfig {                       // [model]
  ModelFamily family = ModelFamily::GPT2;  // family = "gpt2" | "llama"
  int64_t n_layer = 2;
  int64_t d_model = 64;  // width C
  int64_t n_head = 4;
  int64_t n_kv_head = 0;  // 0 = n_head (MHA); llama may use fewer (GQA)
  int64_t d_ff = 0;       // 0 = 4*C (gpt2) or the LLaMA rule (see model.cpp)
  int64_t vocab_size = 512;
  int64_t max_seq_len = 64;  // positions (gpt2 wpe rows) and the longest sequence
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;
  bool tie_embeddings = true;  // gpt2 ties; llama default false (recipes say so)
  bool recompute = false;      // recompute each layer's activations in backward

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
};

}  // namespace pentad
