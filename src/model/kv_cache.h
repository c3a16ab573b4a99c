#pragma once
// The keys and values a one-device model has computed for one sequence, per layer, so that
// decoding a new token costs one row of every layer instead of a forward over the whole
// prefix (Model::decode, model/decode.cpp). On the model's device (CPU or CUDA), in its
// compute type (fp32, or bf16 on CUDA), in one arena.
//
// Per layer: k, v (context, kv_heads, head_dim): row t is position t's key (after RoPE for
// LLaMA) and value, the layout the q/k/v projections write and the attention kernel reads,
// so a new token's projection lands in the cache in place. Rows [0, length) are filled.
// The scratch holds one call's activations for up to `context` new rows (a whole prompt).
#include <cstdint>
#include <vector>

#include "core/params.h"
#include "core/tensor.h"
#include "model/config.h"

namespace pentad {

class KvCache {
 public:
  // A cache for sequences of up to `context` tokens (at most cfg.max_seq_len), on the
  // placement's device and in its compute type: the Model's that decodes with it.
  KvCache(const ModelConfig& cfg, int64_t context, Placement placement = {});

  int64_t context() const { return context_; }
  int64_t length() const { return length_; }  // positions filled
  void clear() { length_ = 0; }
  Device device() const { return arena_.device(); }
  DType dtype() const { return dtype_; }
  // Bytes held on the device: the caches and the scratch.
  size_t bytes() const { return arena_.capacity(); }

 private:
  friend class Model;  // Model::decode fills and reads it
  int64_t context_, length_ = 0;
  DType dtype_;
  Arena arena_;
  std::vector<Tensor> k_, v_;  // per layer (context, kv_heads * head_dim)
  Tensor positions_;           // I32 0..context-1: the attention kernel's k_pos/q_pos
  Tensor ids_;                 // I32 (context): one call's new tokens (on CUDA, uploaded)
  // One decode call's activations, rows = the new tokens (n <= context), each planned for
  // `context` rows (Tensor::prefix). C: width, Ca: the query heads' width, F: the widest MLP
  // (dense, or an MoE layer's shared experts). Statistics (mean, rstd, lse) are F32.
  Tensor x_, y_, res1_, norm_;      // (n, C) residual in, out, after attention, normed
  Tensor mean_, rstd_;              // (n)
  Tensor q_, att_, lse_;            // (n, Ca), (n, Ca), (heads, n)
  Tensor up_, gate_, act_;          // (n, F)
  Tensor moe_;                      // (n, C): the routed experts' output
  Tensor normf_, logits_;           // (1, C), (1, V): the last new row only
  std::vector<float> host_logits_;  // a device's logits, read back
};

}  // namespace pentad
