#include "model/model.h"

#include <cmath>
#include <string>

#include "kernels/ops.h"

namespace pentad {

namespace k = kernels;

int64_t ffn_dim(const ModelConfig& cfg) {
  if (cfg.d_ff > 0) return cfg.d_ff;
  if (cfg.family == ModelFamily::GPT2) return 4 * cfg.d_model;
  int64_t hidden = 2 * (4 * cfg.d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

Model::Model(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len)
    : cfg_(cfg), b_(micro_batch), t_(seq_len) {
  PENTAD_CHECK(seq_len <= cfg.max_seq_len, "seq_len {} > max_seq_len {}", seq_len, cfg.max_seq_len);
  build_params();
  params_.allocate();
  Arena measure = Arena::measuring("activations");
  plan(measure);
  acts_ = Arena("activations", measure.used());
  plan(acts_);
}

void Model::build_params() {
  const int64_t C = cfg_.d_model, V = cfg_.vocab_size, F = ffn_dim(cfg_);
  const int64_t Ckv = cfg_.kv_heads() * cfg_.head_dim();
  const float std = cfg_.init_std;
  // Residual projections are scaled so the residual stream's variance does not grow with depth.
  const float resid_std = std / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  auto matrix = [&](const std::string& name, Shape shape, float s) {
    return params_.add(name, shape, Init::Normal, s, true);
  };
  auto vector = [&](const std::string& name, int64_t n, Init init) {
    return params_.add(name, Shape{n}, init, 0.0f, false);
  };
  const bool bias = gpt2();

  wte_ = matrix("wte.weight", Shape{V, C}, std);
  if (gpt2()) wpe_ = matrix("wpe.weight", Shape{cfg_.max_seq_len, C}, std);
  layers_.resize(static_cast<size_t>(cfg_.n_layer));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    LayerParams& p = layers_[static_cast<size_t>(l)];
    const std::string pre = "layers." + std::to_string(l) + ".";
    p.norm1_w = vector(pre + "norm1.weight", C, Init::Ones);
    if (bias) p.norm1_b = vector(pre + "norm1.bias", C, Init::Zeros);
    p.q_w = matrix(pre + "attn.q.weight", Shape{C, C}, std);
    if (bias) p.q_b = vector(pre + "attn.q.bias", C, Init::Zeros);
    p.k_w = matrix(pre + "attn.k.weight", Shape{Ckv, C}, std);
    if (bias) p.k_b = vector(pre + "attn.k.bias", Ckv, Init::Zeros);
    p.v_w = matrix(pre + "attn.v.weight", Shape{Ckv, C}, std);
    if (bias) p.v_b = vector(pre + "attn.v.bias", Ckv, Init::Zeros);
    p.o_w = matrix(pre + "attn.o.weight", Shape{C, C}, resid_std);
    if (bias) p.o_b = vector(pre + "attn.o.bias", C, Init::Zeros);
    p.norm2_w = vector(pre + "norm2.weight", C, Init::Ones);
    if (bias) p.norm2_b = vector(pre + "norm2.bias", C, Init::Zeros);
    if (!gpt2()) p.gate_w = matrix(pre + "mlp.gate.weight", Shape{F, C}, std);
    p.up_w = matrix(pre + "mlp.up.weight", Shape{F, C}, std);
    if (bias) p.up_b = vector(pre + "mlp.up.bias", F, Init::Zeros);
    p.down_w = matrix(pre + "mlp.down.weight", Shape{C, F}, resid_std);
    if (bias) p.down_b = vector(pre + "mlp.down.bias", C, Init::Zeros);
  }
  normf_w_ = vector("norm_f.weight", C, Init::Ones);
  if (bias) normf_b_ = vector("norm_f.bias", C, Init::Zeros);
  head_ = cfg_.tie_embeddings ? wte_ : matrix("lm_head.weight", Shape{V, C}, std);
}

void Model::plan(Arena& arena) {
  const int64_t N = b_ * t_, C = cfg_.d_model, V = cfg_.vocab_size, F = ffn_dim(cfg_);
  const int64_t H = cfg_.n_head, Ckv = cfg_.kv_heads() * cfg_.head_dim();
  tokens_ = arena.alloc(Shape{b_, t_}, DType::I32);
  targets_ = arena.alloc(Shape{b_, t_}, DType::I32);
  resid_.clear();
  for (int64_t l = 0; l <= cfg_.n_layer; ++l) resid_.push_back(arena.alloc(Shape{N, C}));
  layer_acts_.assign(cfg_.recompute ? 1 : static_cast<size_t>(cfg_.n_layer), LayerActs{});
  for (LayerActs& a : layer_acts_) {
    a.norm1 = arena.alloc(Shape{N, C});
    if (gpt2()) a.norm1_mean = arena.alloc(Shape{N});
    a.norm1_rstd = arena.alloc(Shape{N});
    a.q = arena.alloc(Shape{N, C});
    a.k = arena.alloc(Shape{N, Ckv});
    a.v = arena.alloc(Shape{N, Ckv});
    a.att = arena.alloc(Shape{N, C});
    a.lse = arena.alloc(Shape{b_, H, t_});
    a.res1 = arena.alloc(Shape{N, C});
    a.norm2 = arena.alloc(Shape{N, C});
    if (gpt2()) a.norm2_mean = arena.alloc(Shape{N});
    a.norm2_rstd = arena.alloc(Shape{N});
    a.up = arena.alloc(Shape{N, F});
    if (!gpt2()) a.gate = arena.alloc(Shape{N, F});
    a.act = arena.alloc(Shape{N, F});
  }
  normf_ = arena.alloc(Shape{N, C});
  if (gpt2()) normf_mean_ = arena.alloc(Shape{N});
  normf_rstd_ = arena.alloc(Shape{N});
  logits_ = arena.alloc(Shape{N, V});
  losses_ = arena.alloc(Shape{N});
  grads_.resid = arena.alloc(Shape{N, C});
  grads_.norm = arena.alloc(Shape{N, C});
  grads_.att = arena.alloc(Shape{N, C});
  grads_.q = arena.alloc(Shape{N, C});
  grads_.k = arena.alloc(Shape{N, Ckv});
  grads_.v = arena.alloc(Shape{N, Ckv});
  grads_.up = arena.alloc(Shape{N, F});
  if (!gpt2()) grads_.gate = arena.alloc(Shape{N, F});
  grads_.act = arena.alloc(Shape{N, F});
}

// Views of (N, C) buffers as (b, t, heads, head_dim) for attention and RoPE.
static Tensor heads(const Tensor& x, int64_t b, int64_t t, int64_t d) {
  return x.reshaped(Shape{b, t, x.dim(1) / d, d});
}

void Model::layer_forward(int l, const Tensor& x, Tensor out, LayerActs& a) {
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  const int64_t d = cfg_.head_dim();
  if (gpt2())
    k::layernorm_forward(a.norm1, a.norm1_mean, a.norm1_rstd, x, P(p.norm1_w), P(p.norm1_b), cfg_.norm_eps);
  else
    k::rmsnorm_forward(a.norm1, a.norm1_rstd, x, P(p.norm1_w), cfg_.norm_eps);
  k::linear_forward(a.q, a.norm1, P(p.q_w), P(p.q_b));
  k::linear_forward(a.k, a.norm1, P(p.k_w), P(p.k_b));
  k::linear_forward(a.v, a.norm1, P(p.v_w), P(p.v_b));
  if (!gpt2()) {
    k::rope_forward(heads(a.q, b_, t_, d), 0, cfg_.rope_theta);
    k::rope_forward(heads(a.k, b_, t_, d), 0, cfg_.rope_theta);
  }
  k::attention_forward(heads(a.att, b_, t_, d), a.lse, heads(a.q, b_, t_, d), heads(a.k, b_, t_, d),
                       heads(a.v, b_, t_, d));
  k::linear_forward(out, a.att, P(p.o_w), P(p.o_b));  // out holds the projection for a moment
  k::add(a.res1, x, out);
  if (gpt2()) {
    k::layernorm_forward(a.norm2, a.norm2_mean, a.norm2_rstd, a.res1, P(p.norm2_w), P(p.norm2_b),
                         cfg_.norm_eps);
    k::linear_forward(a.up, a.norm2, P(p.up_w), P(p.up_b));
    k::gelu_forward(a.act, a.up);
  } else {
    k::rmsnorm_forward(a.norm2, a.norm2_rstd, a.res1, P(p.norm2_w), cfg_.norm_eps);
    k::linear_forward(a.gate, a.norm2, P(p.gate_w), Tensor{});
    k::linear_forward(a.up, a.norm2, P(p.up_w), Tensor{});
    k::swiglu_forward(a.act, a.gate, a.up);
  }
  k::linear_forward(out, a.act, P(p.down_w), P(p.down_b));
  k::add(out, out, a.res1);
}

float Model::forward(const int32_t* tokens, const int32_t* targets, float dloss) {
  const int64_t N = b_ * t_, L = cfg_.n_layer;
  const int64_t V = cfg_.vocab_size;
  int32_t* tok = tokens_.as<int32_t>();
  int32_t* tgt = targets_.as<int32_t>();
  for (int64_t i = 0; i < N; ++i) {
    PENTAD_CHECK(tokens[i] >= 0 && tokens[i] < V && targets[i] >= 0 && targets[i] < V,
                 "token id out of range at {}", i);
    tok[i] = tokens[i];
    tgt[i] = targets[i];
  }
  k::embedding_forward(resid_[0].reshaped(Shape{b_, t_, cfg_.d_model}), tokens_, P(wte_), P(wpe_));
  for (int64_t l = 0; l < L; ++l) {
    LayerActs& a = layer_acts_[cfg_.recompute ? 0 : static_cast<size_t>(l)];
    layer_forward(static_cast<int>(l), resid_[static_cast<size_t>(l)], resid_[static_cast<size_t>(l + 1)], a);
  }
  const Tensor& last = resid_[static_cast<size_t>(L)];
  if (gpt2())
    k::layernorm_forward(normf_, normf_mean_, normf_rstd_, last, P(normf_w_), P(normf_b_), cfg_.norm_eps);
  else
    k::rmsnorm_forward(normf_, normf_rstd_, last, P(normf_w_), cfg_.norm_eps);
  k::linear_forward(logits_, normf_, P(head_), Tensor{});
  have_dlogits_ = dloss != 0.0f;
  k::crossentropy_forward_backward(losses_, have_dlogits_ ? logits_ : Tensor{}, logits_, targets_, dloss);
  double sum = 0.0;
  const float* losses = losses_.f32();
  for (int64_t i = 0; i < N; ++i) sum += losses[i];
  return static_cast<float>(sum / static_cast<double>(N));
}

void Model::layer_backward(int l, const Tensor& x, LayerActs& a) {
  const LayerParams& p = layers_[static_cast<size_t>(l)];
  const int64_t d = cfg_.head_dim();
  Grads& g = grads_;
  // MLP block: g.resid holds d(out) and, through the residual, d(res1) so far.
  if (gpt2()) {
    k::linear_backward(g.act, G(p.down_w), G(p.down_b), g.resid, a.act, P(p.down_w), false);
    k::gelu_backward(g.up, g.act, a.up);
    k::linear_backward(g.norm, G(p.up_w), G(p.up_b), g.up, a.norm2, P(p.up_w), false);
    k::layernorm_backward(g.resid, G(p.norm2_w), G(p.norm2_b), g.norm, a.res1, P(p.norm2_w),
                          a.norm2_mean, a.norm2_rstd);
  } else {
    k::linear_backward(g.act, G(p.down_w), Tensor{}, g.resid, a.act, P(p.down_w), false);
    k::swiglu_backward(g.gate, g.up, g.act, a.gate, a.up);
    k::linear_backward(g.norm, G(p.gate_w), Tensor{}, g.gate, a.norm2, P(p.gate_w), false);
    k::linear_backward(g.norm, G(p.up_w), Tensor{}, g.up, a.norm2, P(p.up_w), true);
    k::rmsnorm_backward(g.resid, G(p.norm2_w), g.norm, a.res1, P(p.norm2_w), a.norm2_rstd);
  }
  // Attention block: g.resid now holds d(res1).
  k::linear_backward(g.att, G(p.o_w), G(p.o_b), g.resid, a.att, P(p.o_w), false);
  k::attention_backward(heads(g.q, b_, t_, d), heads(g.k, b_, t_, d), heads(g.v, b_, t_, d),
                        heads(g.att, b_, t_, d), heads(a.q, b_, t_, d), heads(a.k, b_, t_, d),
                        heads(a.v, b_, t_, d), heads(a.att, b_, t_, d), a.lse);
  if (!gpt2()) {
    k::rope_backward(heads(g.q, b_, t_, d), 0, cfg_.rope_theta);
    k::rope_backward(heads(g.k, b_, t_, d), 0, cfg_.rope_theta);
  }
  k::linear_backward(g.norm, G(p.q_w), G(p.q_b), g.q, a.norm1, P(p.q_w), false);
  k::linear_backward(g.norm, G(p.k_w), G(p.k_b), g.k, a.norm1, P(p.k_w), true);
  k::linear_backward(g.norm, G(p.v_w), G(p.v_b), g.v, a.norm1, P(p.v_w), true);
  if (gpt2())
    k::layernorm_backward(g.resid, G(p.norm1_w), G(p.norm1_b), g.norm, x, P(p.norm1_w),
                          a.norm1_mean, a.norm1_rstd);
  else
    k::rmsnorm_backward(g.resid, G(p.norm1_w), g.norm, x, P(p.norm1_w), a.norm1_rstd);
}

void Model::backward() {
  PENTAD_CHECK(have_dlogits_, "backward() needs a forward() with dloss != 0");
  const int64_t L = cfg_.n_layer;
  Grads& g = grads_;
  k::scale(g.resid, 0.0f);  // the norm backward below accumulates into it
  k::linear_backward(g.norm, G(head_), Tensor{}, logits_, normf_, P(head_), false);
  const Tensor& last = resid_[static_cast<size_t>(L)];
  if (gpt2())
    k::layernorm_backward(g.resid, G(normf_w_), G(normf_b_), g.norm, last, P(normf_w_), normf_mean_,
                          normf_rstd_);
  else
    k::rmsnorm_backward(g.resid, G(normf_w_), g.norm, last, P(normf_w_), normf_rstd_);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Tensor& x = resid_[static_cast<size_t>(l)];
    LayerActs& a = layer_acts_[cfg_.recompute ? 0 : static_cast<size_t>(l)];
    if (cfg_.recompute) layer_forward(static_cast<int>(l), x, resid_[static_cast<size_t>(l + 1)], a);
    layer_backward(static_cast<int>(l), x, a);
  }
  k::embedding_backward(G(wte_), G(wpe_), g.resid.reshaped(Shape{b_, t_, cfg_.d_model}), tokens_);
  have_dlogits_ = false;
}

double Model::flops_per_micro_batch() const {
  const double C = static_cast<double>(cfg_.d_model), F = static_cast<double>(ffn_dim(cfg_));
  const double Ckv = static_cast<double>(cfg_.kv_heads() * cfg_.head_dim());
  const double V = static_cast<double>(cfg_.vocab_size), T = static_cast<double>(t_);
  const double mlp = (gpt2() ? 2.0 : 3.0) * C * F;
  const double matmul_params = static_cast<double>(cfg_.n_layer) * (2 * C * C + 2 * C * Ckv + mlp) + V * C;
  // Causal attention: each query meets t/2 keys on average; QK^T and PV cost 2*C flops per
  // pair each, so 2*C*t per token forward, written here in the same units as a parameter.
  const double attention = static_cast<double>(cfg_.n_layer) * C * T;
  const double tokens = static_cast<double>(b_ * t_);
  return 3.0 * 2.0 * tokens * (matmul_params + attention);  // forward + 2x for backward
}

}  // namespace pentad
