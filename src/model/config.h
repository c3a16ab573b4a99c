#pragma once
// The [model] section of a recipe: the architecture, and the [moe] section: how its
// Mixture-of-Experts layers route (src/recipe/recipe.cpp fills both).
#include <cstdint>
#include <string>
#include <vector>

namespace pentad {

enum class ModelFamily { GPT2, LLaMA };

// moe.score: how the router turns logits into probabilities.
enum class MoeScore { Softmax, Sigmoid };
// Its name in a recipe ("softmax", "sigmoid").
inline const char* moe_score_name(MoeScore score) {
  return score == MoeScore::Sigmoid ? "sigmoid" : "softmax";
}

// [moe]: the router and the losses that balance it (src/model/moe.h has the formulas).
struct MoeConfig {
  MoeScore score = MoeScore::Softmax;  // "softmax" | "sigmoid": router probabilities
  bool renormalize = true;             // top-k weights divided by their sum
  float aux_loss_coef = 0.0f;          // Switch/GShard load balancing, over each micro-batch
  float seq_aux_loss_coef = 0.0f;      // the same, per sequence (DeepSeek-V3's complementary loss)
  float z_loss_coef = 0.0f;            // router z-loss: mean squared logsumexp of the logits
  // Aux-loss-free balancing (DeepSeek-V3): after each step every expert's selection bias
  // moves by this much toward balance (up when it got fewer tokens than the mean); 0: off.
  float bias_update_rate = 0.0f;
  // 0: dropless. Above 0: each expert takes at most ceil(capacity_factor * tokens * top_k /
  // n_experts) of one micro-batch's tokens, keeping those of highest router probability.
  float capacity_factor = 0.0f;
  bool operator==(const MoeConfig&) const = default;
};

// model.recompute: whether backward rebuilds each layer's activations instead of keeping
// them (less memory, a forward's more compute). true and false are what runs; "auto" is
// decided before the model is built (resolve_recompute, src/plan/memory_budget.h): on only
// where the memory plan does not fit without it. `on` then holds the choice.
struct Recompute {
  bool on = false;
  bool automatic = false;  // the recipe said "auto"
  explicit operator bool() const { return on; }
  Recompute& operator=(bool value) {
    on = value;
    automatic = false;
    return *this;
  }
  bool operator==(const Recompute&) const = default;
};

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
  Recompute recompute;         // recompute each layer's activations in backward

  // Mixture of Experts (src/model/moe.h): layers named by moe_layers replace their MLP
  // with n_experts routed experts (top_k per token, each an MLP of the family's kind and
  // width d_ff_expert; 0 = ffn width) plus n_shared_experts always-on experts of that
  // width (one MLP n_shared_experts times as wide). moe_layers: "" (dense model), "all",
  // "every:N" (layers N-1, 2N-1, ...: every Nth), "from:K" (layers K.. last: the first K
  // stay dense, as DeepSeek's) or a list of layer indices "1,3,5".
  std::string moe_layers;
  int64_t n_experts = 0;
  int64_t top_k = 2;
  int64_t d_ff_expert = 0;
  int64_t n_shared_experts = 0;
  MoeConfig moe;  // [moe]

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  bool is_moe() const { return n_experts > 0 && !moe_layers.empty(); }
  bool operator==(const ModelConfig&) const = default;
};

}  // namespace pentad
