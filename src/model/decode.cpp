// Model::decode: the forward of a few new rows against cached keys and values
// (model/kv_cache.h), with the training forward's kernels and parameters. Each step mirrors
// layer_forward() for one device: norm, q/k/v, RoPE at the rows' own positions (LLaMA) or
// learned positions (GPT-2), causal attention of the new query rows over every cached row,
// out projection, residual + norm, MLP and/or routed experts, residual.
#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "model/model.h"

namespace pentad {

namespace k = kernels;

KvCache::KvCache(const ModelConfig& cfg, int64_t context) : context_(context) {
  if (context < 1 || context > cfg.max_seq_len)
    fail("a cache of {} positions for a model whose context (model.max_seq_len) is {}", context,
         cfg.max_seq_len);
  const int64_t C = cfg.d_model, kv = cfg.kv_heads() * cfg.head_dim(), n = context;
  int64_t F = ffn_dim(cfg);
  if (cfg.is_moe()) F = std::max(F, cfg.n_shared_experts * expert_ffn_dim(cfg));
  const auto layers = static_cast<size_t>(cfg.n_layer);
  k_.assign(layers, std::vector<float>(size_t(n * kv)));
  v_.assign(layers, std::vector<float>(size_t(n * kv)));
  positions_.resize(size_t(n));
  for (int64_t t = 0; t < n; ++t) positions_[size_t(t)] = static_cast<int32_t>(t);
  for (auto* buf : {&x_, &y_, &res1_, &norm_, &q_, &att_, &moe_}) buf->resize(size_t(n * C));
  for (auto* buf : {&mean_, &rstd_}) buf->resize(size_t(n));
  lse_.resize(size_t(n * cfg.n_head));
  for (auto* buf : {&up_, &gate_, &act_}) buf->resize(size_t(n * F));
  normf_.resize(size_t(C));
  logits_.resize(size_t(cfg.vocab_size));
}

size_t KvCache::bytes() const {
  size_t floats = 0;
  for (const auto& layer : k_) floats += 2 * layer.size();
  for (const auto* buf : {&x_, &y_, &res1_, &norm_, &mean_, &rstd_, &q_, &att_, &lse_, &up_, &gate_,
                          &act_, &moe_, &normf_, &logits_})
    floats += buf->size();
  return floats * sizeof(float) + positions_.size() * sizeof(int32_t);
}

namespace {
// The first shape.numel() floats of a scratch buffer, seen as `shape`.
Tensor scratch(std::vector<float>& buf, Shape shape) {
  PENTAD_CHECK(shape.numel() <= static_cast<int64_t>(buf.size()), "decode scratch {} of {}",
               shape.str(), buf.size());
  return view_of(buf.data(), shape);
}
}  // namespace

std::span<const float> Model::decode(KvCache& cache, std::span<const int32_t> tokens) {
  PENTAD_CHECK(tp_->degree() == 1 && cp_->degree() == 1 && ep_->ep_degree() == 1 && chunks() == 1 &&
                   chunk(0).first && chunk(0).last && placement_.device == Device::CPU &&
                   act_ == DType::F32,
               "decode: a one-device fp32 CPU model holding every layer");
  const int64_t n = static_cast<int64_t>(tokens.size()), pos = cache.length_;
  const int64_t C = cfg_.d_model, V = cfg_.vocab_size, d = cfg_.head_dim();
  const int64_t H = heads_, Hkv = kv_heads_, keys = pos + n;
  PENTAD_CHECK(cache.k_.size() == static_cast<size_t>(cfg_.n_layer) &&
                   cache.logits_.size() == static_cast<size_t>(V),
               "decode: the cache was made for another model");
  PENTAD_CHECK(n >= 1 && keys <= cache.context(), "decode: {} new tokens after {} of {} positions",
               n, pos, cache.context());
  for (int64_t i = 0; i < n; ++i)
    PENTAD_CHECK(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < V, "token id {} out of range",
                 tokens[size_t(i)]);
  const Tensor ids = view_of(const_cast<int32_t*>(tokens.data()), Shape{1, n}, DType::I32);
  // Positions of the new rows (queries) and of every cached row (keys), for the attention
  // kernel's mask and GPT-2's position embedding.
  const Tensor q_pos = view_of(cache.positions_.data() + pos, Shape{n}, DType::I32);
  const Tensor k_pos = view_of(cache.positions_.data(), Shape{keys}, DType::I32);

  Tensor x = scratch(cache.x_, Shape{n, C}), y = scratch(cache.y_, Shape{n, C});
  const Tensor res1 = scratch(cache.res1_, Shape{n, C}), norm = scratch(cache.norm_, Shape{n, C});
  const Tensor mean = scratch(cache.mean_, Shape{n}), rstd = scratch(cache.rstd_, Shape{n});
  const Tensor q = scratch(cache.q_, Shape{n, att_width_});
  const Tensor att = scratch(cache.att_, Shape{n, att_width_});
  const Tensor lse = scratch(cache.lse_, Shape{1, H, n});
  k::embedding_forward(x.reshaped(Shape{1, n, C}), ids, P(wte_), P(wpe_), -1, q_pos);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const LayerParams& p = layers_[size_t(l)];
    // This layer's cache, (context, kv heads, d); the new rows' k and v land in place.
    const Tensor k_all = view_of(cache.k_[size_t(l)].data(), Shape{cache.context(), kv_width_});
    const Tensor v_all = view_of(cache.v_[size_t(l)].data(), Shape{cache.context(), kv_width_});
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
      const Tensor up = scratch(cache.up_, Shape{n, ffn}), act = scratch(cache.act_, Shape{n, ffn});
      if (gpt2()) {
        k::linear_gelu_forward(act, up, norm, P(p.up_w), P(p.up_b));
      } else {
        const Tensor gate = scratch(cache.gate_, Shape{n, ffn});
        k::linear_forward(gate, norm, P(p.gate_w), Tensor{});
        k::linear_forward(up, norm, P(p.up_w), Tensor{});
        k::swiglu_forward(act, gate, up);
      }
      k::linear_forward(y, act, P(p.down_w), P(p.down_b));
    }
    if (MoeBlock* block = moe_[size_t(l)].get()) {
      const Tensor routed = scratch(cache.moe_, Shape{n, C});
      block->decode(norm, ffn > 0 ? routed : y);
      if (ffn > 0) k::add(y, y, routed);
    }
    k::add(y, y, res1);
    std::swap(x, y);  // the layer's output is the next one's input
  }
  // The head on the last new row only: the one whose next token is wanted.
  const Tensor last = x.rows(n - 1, 1), normf = scratch(cache.normf_, Shape{1, C});
  if (gpt2())
    k::layernorm_forward(normf, mean.rows(0, 1), rstd.rows(0, 1), last, P(normf_w_), P(normf_b_),
                         cfg_.norm_eps);
  else
    k::rmsnorm_forward(normf, rstd.rows(0, 1), last, P(normf_w_), cfg_.norm_eps);
  k::linear_forward(scratch(cache.logits_, Shape{1, V}), normf, P(head_), Tensor{});
  cache.length_ = keys;
  return {cache.logits_.data(), static_cast<size_t>(V)};
}

}  // namespace pentad
