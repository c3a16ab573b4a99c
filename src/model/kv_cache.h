#pragma once
// The keys and values a one-device CPU model has computed for one sequence, per layer, so
// that decoding a new token costs one row of every layer instead of a forward over the whole
// prefix (Model::decode, model/decode.cpp). fp32, host memory.
//
// Per layer: k, v (context, kv_heads, head_dim): row t is position t's key (after RoPE for
// LLaMA) and value, the layout the q/k/v projections write and the attention kernel reads,
// so a new token's projection lands in the cache in place. Rows [0, length) are filled.
// The scratch holds one call's activations for up to `context` new rows (a whole prompt).
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace pentad {

class KvCache {
 public:
  // A cache for sequences of up to `context` tokens (at most cfg.max_seq_len).
  KvCache(const ModelConfig& cfg, int64_t context);

  int64_t context() const { return context_; }
  int64_t length() const { return length_; }  // positions filled
  void clear() { length_ = 0; }
  // Bytes held: the caches and the scratch.
  size_t bytes() const;

 private:
  friend class Model;  // Model::decode fills and reads it
  int64_t context_, length_ = 0;
  std::vector<std::vector<float>> k_, v_;  // per layer (context, kv_heads, head_dim)
  std::vector<int32_t> positions_;         // 0..context-1: the attention kernel's k_pos/q_pos
  // One decode call's activations, rows = the new tokens (n <= context). C: width, Ca: the
  // query heads' width, F: the widest MLP (dense, or an MoE layer's shared experts).
  std::vector<float> x_, y_, res1_;           // (n, C) residual in, out, after attention
  std::vector<float> norm_, mean_, rstd_;     // (n, C), (n), (n)
  std::vector<float> q_, att_, lse_;          // (n, Ca), (n, Ca), (heads, n)
  std::vector<float> up_, gate_, act_, moe_;  // (n, F) x3, (n, C): the routed experts' output
  std::vector<float> normf_, logits_;         // (1, C), (1, V): the last new row only
};

}  // namespace pentad
