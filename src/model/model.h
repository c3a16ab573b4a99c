#pragma once
// The decoder-only transformer, written for one device: GPT-2 (LayerNorm, GELU, learned
// positions, tied embeddings, biases) or LLaMA (RMSNorm, SwiGLU, RoPE, grouped-query
// attention, untied embeddings, no biases), chosen by ModelConfig::family.
// Forward and backward are explicit, layer by layer; every activation lives in one arena
// planned for a fixed micro-batch (b, t).
//
// Tensor parallelism (Megatron): with a TensorParallel of degree p, this rank holds 1/p of
// the heads (q, k, v column-parallel, o row-parallel), of the MLP width (up/gate column,
// down row) and of the vocabulary (embedding and head, with a vocabulary-parallel
// cross-entropy). Degree 1 is the single-device model; the same code runs both.
#include <cstdint>
#include <functional>
#include <vector>

#include "model/params.h"
#include "parallel/tp/tensor_parallel.h"
#include "train/config.h"

namespace pentad {

// Feed-forward width: d_ff if set, else 4C (GPT-2) or LLaMA's 2/3 * 4C rounded up to 256.
int64_t ffn_dim(const ModelConfig& cfg);

// Called during backward: gradients at element offsets [offset, end) of the gradient arena
// are final for this micro-batch (data parallelism starts reducing them).
using GradsReady = std::function<void(int64_t offset)>;

class Model {
 public:
  Model(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len,
        parallel::TensorParallel tp = {});

  // Mean cross-entropy of the micro-batch. tokens, targets: (b, t). When dloss != 0 the
  // gradient of (dloss * sum of token losses) w.r.t. logits is kept for backward().
  float forward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Accumulates parameter gradients (+=) for the last forward, which must have had dloss != 0.
  // last_micro_batch: the step's gradients are complete after this backward, so replicated
  // parameters whose gradients are partial per tp rank (norms, under sequence parallelism)
  // are summed over tp, and on_ready (if given) hears of each finished range.
  void backward(bool last_micro_batch = true, const GradsReady& on_ready = {});
  // Whether parameter id's gradient is the same on every tp rank (replicated parameters)
  // or this rank's shard of it; the global gradient norm counts replicated ones once.
  bool tp_sharded(int id) const { return params_.spec(id).shard_dim >= 0; }
  const parallel::TensorParallel& tp() const { return tp_; }

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
  // One layer's saved activations, this rank's share. N = b*t rows, Nl = rows of the
  // replicated regions, C width; Ca, Ckv, F, H: this rank's attention width, kv width,
  // MLP width and heads (the whole model's divided by the tp degree).
  struct LayerActs {
    Tensor norm1, norm1_mean, norm1_rstd;  // (N, C) whole rows, (Nl), (Nl)
    Tensor q, k, v;                        // (N, Ca), (N, Ckv), (N, Ckv); after RoPE (llama)
    Tensor att, lse;                       // (N, Ca), (b, H, t)
    Tensor res1;                           // (Nl, C): input + attention block
    Tensor norm2, norm2_mean, norm2_rstd;  // (N, C), (Nl), (Nl)
    Tensor up, gate, act;                  // (N, F) each; gpt2: up = fc pre-GELU, act = GELU(up)
  };
  struct Grads {  // scratch for backward, shared by all layers
    Tensor resid;                 // (Nl, C): d(residual stream), this rank's rows
    Tensor full;                  // (N, C): resid made whole (sequence parallel only)
    Tensor norm, norm_local;      // (N, C) partial d(norm output); (Nl, C) reduced (SP only)
    Tensor att, q, k, v, up, gate, act;
  };

  void build_params();
  void sync_partial_grads(const std::vector<int>& ids);  // tp all-reduce (sequence parallel)
  void plan(Arena& arena);  // allocates every activation; run once measuring, once for real
  void layer_forward(int l, const Tensor& x, Tensor out, LayerActs& a);
  void layer_backward(int l, const Tensor& x, LayerActs& a);
  Tensor P(int id) const { return id < 0 ? Tensor{} : params_.param(id); }
  Tensor G(int id) const { return id < 0 ? Tensor{} : params_.grad(id); }
  bool gpt2() const { return cfg_.family == ModelFamily::GPT2; }

  ModelConfig cfg_;
  int64_t b_, t_;
  parallel::TensorParallel tp_;
  // Per-rank sizes: heads, kv heads, width of attention outputs, MLP width, vocabulary
  // rows, rows of the replicated regions (b*t, or b*t/p with sequence parallelism).
  int64_t heads_, kv_heads_, att_width_, kv_width_, ffn_, vocab_, rows_;
  int64_t vocab_start_;  // first vocabulary row held here; -1 when the table is whole
  ParamStore params_;
  int wte_ = -1, wpe_ = -1, normf_w_ = -1, normf_b_ = -1, head_ = -1;
  std::vector<LayerParams> layers_;

  Arena acts_;
  Tensor tokens_, targets_;               // (b, t) I32
  std::vector<Tensor> resid_;             // L+1 residual streams (Nl, C); resid_[0] = embeddings
  std::vector<std::vector<int>> partial_; // per layer (and last: final norm) ids to sync under SP
  std::vector<LayerActs> layer_acts_;     // L entries, or 1 reused entry with recompute
  Tensor norm_local_;                     // (Nl, C) norm output before the SP all-gather
  Tensor proj_;                           // (N, C) row-parallel partial sums before reduction
  Tensor normf_local_, normf_, normf_mean_, normf_rstd_, logits_, losses_;
  Tensor row_max_, ce_stats_;             // (N), (2, N): vocabulary-parallel cross-entropy
  Grads grads_;
  bool have_dlogits_ = false;
};

}  // namespace pentad
