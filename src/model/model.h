#pragma once
// The decoder-only transformer, written for one device: GPT-2 (LayerNorm, GELU, learned
// positions, tied embeddings, biases) or LLaMA (RMSNorm, SwiGLU, RoPE, grouped-query
// attention, untied embeddings, no biases), chosen by ModelConfig::family.
// Forward and backward are explicit, layer by layer; every activation lives in one arena
// planned for a fixed micro-batch (b, t).
#include <cstdint>
#include <vector>

#include "model/params.h"
#include "train/config.h"

namespace pentad {

// Feed-forward width: d_ff if set, else 4C (GPT-2) or LLaMA's 2/3 * 4C rounded up to 256.
int64_t ffn_dim(const ModelConfig& cfg);

class Model {
 public:
  Model(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len);

  // Mean cross-entropy of the micro-batch. tokens, targets: (b, t). When dloss != 0 the
  // gradient of (dloss * sum of token losses) w.r.t. logits is kept for backward().
  float forward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Accumulates parameter gradients (+=) for the last forward, which must have had dloss != 0.
  void backward();

  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  const ModelConfig& config() const { return cfg_; }
  Tensor logits() const { return logits_; }  // (b*t, V); holds dlogits after a training forward
  size_t activation_bytes() const { return acts_.capacity(); }
  size_t activation_high_water() const { return acts_.high_water(); }
  int64_t micro_batch() const { return b_; }
  int64_t seq_len() const { return t_; }
  // Training FLOPs of one micro-batch (forward + backward, matmuls and attention).
  double flops_per_micro_batch() const;

 private:
  struct LayerParams {
    int norm1_w = -1, norm1_b = -1, q_w = -1, q_b = -1, k_w = -1, k_b = -1, v_w = -1, v_b = -1;
    int o_w = -1, o_b = -1, norm2_w = -1, norm2_b = -1;
    int up_w = -1, up_b = -1, gate_w = -1, down_w = -1, down_b = -1;
  };
  // One layer's saved activations. Shapes: N = b*t rows, C width, Ckv = kv heads * head dim,
  // F = ffn width, H = query heads.
  struct LayerActs {
    Tensor norm1, norm1_mean, norm1_rstd;  // (N, C), (N), (N)
    Tensor q, k, v;                        // (N, C), (N, Ckv), (N, Ckv); after RoPE (llama)
    Tensor att, lse;                       // (N, C), (b, H, t)
    Tensor res1;                           // (N, C): input + attention block
    Tensor norm2, norm2_mean, norm2_rstd;  // (N, C), (N), (N)
    Tensor up, gate, act;                  // (N, F) each; gpt2: up = fc pre-GELU, act = GELU(up)
  };
  struct Grads {  // scratch for backward, shared by all layers
    Tensor resid, norm, att, q, k, v, up, gate, act;
  };

  void build_params();
  void plan(Arena& arena);  // allocates every activation; run once measuring, once for real
  void layer_forward(int l, const Tensor& x, Tensor out, LayerActs& a);
  void layer_backward(int l, const Tensor& x, LayerActs& a);
  Tensor P(int id) const { return id < 0 ? Tensor{} : params_.param(id); }
  Tensor G(int id) const { return id < 0 ? Tensor{} : params_.grad(id); }
  bool gpt2() const { return cfg_.family == ModelFamily::GPT2; }

  ModelConfig cfg_;
  int64_t b_, t_;
  ParamStore params_;
  int wte_ = -1, wpe_ = -1, normf_w_ = -1, normf_b_ = -1, head_ = -1;
  std::vector<LayerParams> layers_;

  Arena acts_;
  Tensor tokens_, targets_;               // (b, t) I32
  std::vector<Tensor> resid_;             // L+1 residual streams (N, C); resid_[0] = embeddings
  std::vector<LayerActs> layer_acts_;     // L entries, or 1 reused entry with recompute
  Tensor normf_, normf_mean_, normf_rstd_, logits_, losses_;
  Grads grads_;
  bool have_dlogits_ = false;
};

}  // namespace pentad
