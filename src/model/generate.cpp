#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "kernels/ops.h"

namespace pentad {

void check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    fail("--temperature {}: must be >= 0 (0 = greedy)", o.temperature);
  if (o.top_k < 0) fail("--top-k {}: must be >= 0 (0 = every token)", o.top_k);
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    fail("--top-p {}: must be in (0, 1] (1 = every token)", o.top_p);
}

int32_t pick_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  PENTAD_CHECK(!logits.empty(), "pick_token: no logits");
  if (o.temperature == 0.0)  // max_element keeps the first maximum: ties to the smallest id
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates by falling logit (stable: equal logits keep id order), cut by top-k.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < ids.size()) ids.resize(size_t(o.top_k));
  // Softmax at the temperature, in double, relative to the largest logit.
  std::vector<double> prob(ids.size());
  const double top = logits[size_t(ids[0])];
  double sum = 0.0;
  for (size_t i = 0; i < ids.size(); ++i)
    sum += prob[i] = std::exp((logits[size_t(ids[i])] - top) / o.temperature);
  // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  size_t keep = ids.size();
  if (o.top_p < 1.0) {
    double mass = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      mass += prob[i] / sum;
      if (mass >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  // One uniform draw in [0, kept): the rng's raw bits, so the sequence is the same on
  // every standard library.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * kept;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

namespace {
// Decoding routes without a capacity limit (as transformers' Mixtral does): with one, the
// padded tail would compete with the prefix for expert slots and change its logits.
ModelConfig dropless(ModelConfig cfg) {
  cfg.moe.capacity_factor = 0.0f;
  return cfg;
}
// Generation never runs backward: the gradient arena is reserved address space only (on a
// GPU as on the host), so a model for inference holds its parameters, not twice them.
Placement without_gradients(Placement placement) {
  placement.sparse_grads = true;
  return placement;
}
}  // namespace

Generator::Generator(const ModelConfig& cfg, bool use_cache, Placement placement)
    : model_(dropless(cfg), 1, cfg.max_seq_len, {}, {}, without_gradients(placement)),
      padded_(size_t(cfg.max_seq_len), 0),
      targets_(size_t(cfg.max_seq_len), 0) {
  if (use_cache) cache_ = std::make_unique<KvCache>(cfg, cfg.max_seq_len, placement);
}

void Generator::reset() {
  kernels::refresh_weights(model_.params());
  if (cache_) cache_->clear();
  cached_.clear();
  last_.clear();
}

std::vector<float> Generator::next_logits(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  PENTAD_CHECK(n >= 1 && n <= context(), "next_logits: {} tokens for a context of {}", n,
               context());
  if (cache_) {
    const bool extends = !cached_.empty() && cached_.size() <= tokens.size() &&
                         std::equal(cached_.begin(), cached_.end(), tokens.begin());
    if (!extends) reset();
    if (cached_.size() < tokens.size()) {
      const std::span<const int32_t> fresh = tokens.subspan(cached_.size());
      const std::span<const float> logits = model_.decode(*cache_, fresh);
      cached_.insert(cached_.end(), fresh.begin(), fresh.end());
      last_.assign(logits.begin(), logits.end());
    }
    return last_;
  }
  std::fill(padded_.begin(), padded_.end(), 0);
  std::copy(tokens.begin(), tokens.end(), padded_.begin());
  model_.forward(padded_.data(), targets_.data(), 0.0f);  // dloss 0: the logits stay logits
  const Tensor row = model_.logits().rows(n - 1, 1);
  std::vector<float> out(static_cast<size_t>(row.numel()));
  read_floats(row, out.data());
  return out;
}

}  // namespace pentad
