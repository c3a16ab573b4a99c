// Model::decode: the forward of a few new rows against cached keys and values
// (model/kv_cache.h), with the training forward's kernels and parameters, on the model's
// device (CPU, or CUDA in fp32 or bf16). Each step mirrors
// layer_forward() for one device: norm, q/k/v, RoPE at the rows' own positions (LLaMA) or
// learned positions (GPT-2), causal attention of the new query rows over every cached row,
// out projection, residual + norm, MLP and/or routed experts, residual.
#include <algorithm>
#include <utility>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace pentad {

namespace k = kernels;

KvCache::KvCache(const ModelConfig& cfg, int64_t context, Placement placement)
    : context_(context), dtype_(placement.compute) {
  if (context < 1 || context > cfg.max_seq_len)
    fail("a cache of {} positions for a model whose context (model.max_seq_len) is {}", context,
         cfg.max_seq_len);
  const int64_t C = cfg.d_model, kv = cfg.kv_heads() * cfg.head_dim(), n = context;
  const int64_t Ca = cfg.n_head * cfg.head_dim();
  int64_t F = ffn_dim(cfg);
  if (cfg.is_moe()) F = std::max(F, cfg.n_shared_experts * expert_ffn_dim(cfg));
  const DType act = placement.compute;
  auto plan = [&](Arena& arena) {
    k_.clear();
    v_.clear();
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      k_.push_back(arena.alloc(Shape{n, kv}, act));
      v_.push_back(arena.alloc(Shape{n, kv}, act));
    }
    positions_ = arena.alloc(Shape{n}, DType::I32);
    ids_ = arena.alloc(Shape{n}, DType::I32);
    for (Tensor* t : {&x_, &y_, &res1_, &norm_, &moe_}) *t = arena.alloc(Shape{n, C}, act);
    mean_ = arena.alloc(Shape{n});
    rstd_ = arena.alloc(Shape{n});
    q_ = arena.alloc(Shape{n, Ca}, act);
    att_ = arena.alloc(Shape{n, Ca}, act);
    lse_ = arena.alloc(Shape{cfg.n_head * n});
    for (Tensor* t : {&up_, &gate_, &act_}) *t = arena.alloc(Shape{n, F}, act);
    normf_ = arena.alloc(Shape{1, C}, act);
    logits_ = arena.alloc(Shape{1, cfg.vocab_size}, act);
  };
  Arena measure = Arena::measuring("key/value cache");
  plan(measure);
  arena_ = Arena("key/value cache", measure.used(), placement.device);
  plan(arena_);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = static_cast<int32_t>(t);
  copy_bytes(positions_.data, positions_.device, positions.data(), Device::CPU, positions_.bytes());
  if (placement.device != Device::CPU) host_logits_.resize(size_t(cfg.vocab_size));
}

std::span<const float> Model::decode(KvCache& cache, std::span<const int32_t> tokens) {
  PENTAD_CHECK(tp_->degree() == 1 && cp_->degree() == 1 && ep_->ep_degree() == 1 && chunks() == 1 &&
                   chunk(0).first && chunk(0).last,
               "decode: a one-device model holding every layer");
  PENTAD_CHECK(cache.device() == placement_.device && cache.dtype() == act_,
               "decode: a cache on {} in {} for a model on {} in {}", device_name(cache.device()),
               dtype_name(cache.dtype()), device_name(placement_.device), dtype_name(act_));
  const int64_t n = static_cast<int64_t>(tokens.size()), pos = cache.length_;
  const int64_t C = cfg_.d_model, V = cfg_.vocab_size, d = cfg_.head_dim();
  const int64_t H = heads_, Hkv = kv_heads_, keys = pos + n;
  PENTAD_CHECK(cache.k_.size() == static_cast<size_t>(cfg_.n_layer) && cache.logits_.numel() == V &&
                   cache.q_.dim(1) == att_width_,
               "decode: the cache was made for another model");
  PENTAD_CHECK(n >= 1 && keys <= cache.context(), "decode: {} new tokens after {} of {} positions",
               n, pos, cache.context());
  for (int64_t i = 0; i < n; ++i)
    PENTAD_CHECK(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < V, "token id {} out of range",
                 tokens[size_t(i)]);
  const Tensor ids = cache.ids_.prefix(Shape{1, n});
  copy_bytes(ids.data, ids.device, tokens.data(), Device::CPU, ids.bytes());
  // Positions of the new rows (queries) and of every cached row (keys), for the attention
  // kernel's mask and GPT-2's position embedding.
  const Tensor q_pos = cache.positions_.rows(pos, n), k_pos = cache.positions_.rows(0, keys);

  Tensor x = cache.x_.rows(0, n), y = cache.y_.rows(0, n);
  const Tensor res1 = cache.res1_.rows(0, n), norm = cache.norm_.rows(0, n);
  const Tensor mean = cache.mean_.rows(0, n), rstd = cache.rstd_.rows(0, n);
  const Tensor q = cache.q_.rows(0, n), att = cache.att_.rows(0, n);
  const Tensor lse = cache.lse_.prefix(Shape{1, H, n});
  k::embedding_forward(x.reshaped(Shape{1, n, C}), ids, P(wte_), P(wpe_), -1, q_pos);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const LayerParams& p = layers_[size_t(l)];
    // This layer's cache, (context, kv heads, d); the new rows' k and v land in place.
    const Tensor k_all = cache.k_[size_t(l)], v_all = cache.v_[size_t(l)];
    const Tensor k_new = k_all.rows(pos, n), v_new = v_all.rows(pos, n);
    if (gpt2())
      k::layernorm_forward(norm, mean, rstd, x, P(p.norm1_w), P(p.norm1_b), cfg_.norm_eps);
    else
      k::rmsnorm_forward(norm, rstd, x, P(p.norm1_w), cfg_.norm_eps);
    k::linear_forward(q, norm, P(p.q_w), P(p.q_b));
    k::linear_forward(k_new, norm, P(p.k_w), P(p.k_b));
    k::linear_forward(v_new, norm, P(p.v_w), P(p.v_b));
    if (!gpt2()) {  // rotated at their own positions pos .. pos + n - 1
      k::rope_forward(q.reshaped(Shape{1, n, H, d}), pos, cfg_.rope_theta);
      k::rope_forward(k_new.reshaped(Shape{1, n, Hkv, d}), pos, cfg_.rope_theta);
    }
    k::attention_forward(att.reshaped(Shape{1, n, H, d}), lse, q.reshaped(Shape{1, n, H, d}),
                         k_all.rows(0, keys).reshaped(Shape{1, keys, Hkv, d}),
                         v_all.rows(0, keys).reshaped(Shape{1, keys, Hkv, d}), q_pos, k_pos);
    k::linear_forward(y, att, P(p.o_w), P(p.o_b));
    if (gpt2())
      k::residual_layernorm_forward(res1, norm, mean, rstd, x, y, P(p.norm2_w), P(p.norm2_b),
                                    cfg_.norm_eps);
    else
      k::residual_rmsnorm_forward(res1, norm, rstd, x, y, P(p.norm2_w), cfg_.norm_eps);
    const int64_t ffn = layer_ffn_[size_t(l)];
    if (ffn > 0) {  // the dense MLP, or an MoE layer's shared experts
      const Tensor up = cache.up_.prefix(Shape{n, ffn}), act = cache.act_.prefix(Shape{n, ffn});
      if (gpt2()) {
        k::linear_gelu_forward(act, up, norm, P(p.up_w), P(p.up_b));
      } else {
        const Tensor gate = cache.gate_.prefix(Shape{n, ffn});
        k::linear_forward(gate, norm, P(p.gate_w), Tensor{});
        k::linear_forward(up, norm, P(p.up_w), Tensor{});
        k::swiglu_forward(act, gate, up);
      }
      k::linear_forward(y, act, P(p.down_w), P(p.down_b));
    }
    if (MoeBlock* block = moe_[size_t(l)].get()) {
      const Tensor routed = cache.moe_.rows(0, n);
      block->decode(norm, ffn > 0 ? routed : y);
      if (ffn > 0) k::add(y, y, routed);
    }
    k::add(y, y, res1);
    std::swap(x, y);  // the layer's output is the next one's input
  }
  // The head on the last new row only: the one whose next token is wanted.
  const Tensor last = x.rows(n - 1, 1), normf = cache.normf_;
  if (gpt2())
    k::layernorm_forward(normf, mean.rows(0, 1), rstd.rows(0, 1), last, P(normf_w_), P(normf_b_),
                         cfg_.norm_eps);
  else
    k::rmsnorm_forward(normf, rstd.rows(0, 1), last, P(normf_w_), cfg_.norm_eps);
  k::linear_forward(cache.logits_, normf, P(head_), Tensor{});
  cache.length_ = keys;
  if (placement_.device == Device::CPU) return {cache.logits_.f32(), static_cast<size_t>(V)};
  read_floats(cache.logits_, cache.host_logits_.data());  // on a device: read back
  return cache.host_logits_;
}

void read_floats(const Tensor& t, float* out) {
  PENTAD_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "read_floats: a {} tensor",
               dtype_name(t.dtype));
  if (t.dtype == DType::F32) return copy_bytes(out, Device::CPU, t.data, t.device, t.bytes());
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  copy_bytes(bits.data(), Device::CPU, t.data, t.device, t.bytes());
  std::transform(bits.begin(), bits.end(), out, bf16_to_float);
}

}  // namespace pentad
