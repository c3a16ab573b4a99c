// Generation: the logits of each prefix (the decode path) against the training forward over
// the whole sequence, and the sampling rules against their definitions.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

using namespace pentad;

namespace {

ModelConfig gen_tiny(ModelFamily family, bool moe) {
  ModelConfig cfg;
  cfg.family = family;
  cfg.n_layer = 2;
  cfg.d_model = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = family == ModelFamily::LLaMA ? 2 : 0;
  cfg.vocab_size = 97;
  cfg.max_seq_len = 12;
  cfg.tie_embeddings = family == ModelFamily::GPT2;
  if (moe) {
    cfg.moe_layers = "all";
    cfg.n_experts = 4;
    cfg.top_k = 2;
  }
  return cfg;
}

// Relative (norm-wise) difference of two vectors.
double gen_rel_err(const float* a, const float* b, int64_t n) {
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-30));
}

void expect_prefix_logits_match(const ModelConfig& cfg) {
  const int64_t t = cfg.max_seq_len;
  Model full(cfg, 1, t);
  full.params().initialize(11);
  std::vector<int32_t> tokens(static_cast<size_t>(t)), targets(static_cast<size_t>(t), 0);
  for (int64_t i = 0; i < t; ++i) tokens[size_t(i)] = int32_t((i * 37 + 5) % cfg.vocab_size);
  full.forward(tokens.data(), targets.data(), 0.0f);
  const Tensor logits = full.logits();
  const int64_t V = cfg.vocab_size;

  Generator gen(cfg);
  gen.params().initialize(11);
  for (int64_t n = 1; n <= t; ++n) {
    const std::vector<float> next =
        gen.next_logits(std::span<const int32_t>(tokens.data(), static_cast<size_t>(n)));
    ASSERT_EQ(int64_t(next.size()), V);
    EXPECT_LT(gen_rel_err(next.data(), logits.f32() + (n - 1) * V, V), 1e-5) << "prefix " << n;
  }
}

TEST(Generate, PrefixLogitsEqualFullForwardGpt2) {
  expect_prefix_logits_match(gen_tiny(ModelFamily::GPT2, false));
}
TEST(Generate, PrefixLogitsEqualFullForwardLlamaGqa) {
  expect_prefix_logits_match(gen_tiny(ModelFamily::LLaMA, false));
}
TEST(Generate, PrefixLogitsEqualFullForwardMoe) {
  expect_prefix_logits_match(gen_tiny(ModelFamily::LLaMA, true));
}

TEST(Generate, GreedyTakesFirstMaximum) {
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(pick_token(logits, {}, rng), 1);
}

TEST(Generate, SamplingFollowsSoftmaxTopKTopP) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f, 2.5f};
  // Softmax at temperature 1 over the top-3 (ids 1, 4, 2), then the nucleus 0.7 keeps 1, 4.
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 3;
  o.top_p = 0.7;
  const double e1 = std::exp(0.0), e4 = std::exp(-0.5), e2 = std::exp(-1.0);
  ASSERT_LT(e1 / (e1 + e4 + e2), 0.7);  // so the nucleus needs id 4 too
  std::mt19937_64 rng(7);
  std::map<int32_t, int> seen;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++seen[pick_token(logits, o, rng)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_NEAR(double(seen[1]) / draws, e1 / (e1 + e4), 0.015);
  // Same seed, same tokens.
  std::mt19937_64 a(3), b(3);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(pick_token(logits, o, a), pick_token(logits, o, b));
}

TEST(Generate, RefusesBadSamplingValues) {
  SamplingOptions o;
  o.temperature = -1.0;
  EXPECT_THROW(check_sampling(o), std::exception);
  o = {};
  o.top_p = 0.0;
  EXPECT_THROW(check_sampling(o), std::exception);
  o = {};
  o.top_k = -2;
  EXPECT_THROW(check_sampling(o), std::exception);
}

}  // namespace
