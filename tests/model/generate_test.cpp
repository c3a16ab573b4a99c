// Generation: the logits of each prefix (the cached decode path and the full-forward one)
// against the training forward over the whole sequence, cached decoding against the full
// forward on the tiny recipes' models, and the sampling rules against their definitions.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "recipe/recipe.h"

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

void expect_prefix_logits_match(const ModelConfig& cfg, bool use_cache) {
  const int64_t t = cfg.max_seq_len;
  Model full(cfg, 1, t);
  full.params().initialize(11);
  std::vector<int32_t> tokens(static_cast<size_t>(t)), targets(static_cast<size_t>(t), 0);
  for (int64_t i = 0; i < t; ++i) tokens[size_t(i)] = int32_t((i * 37 + 5) % cfg.vocab_size);
  full.forward(tokens.data(), targets.data(), 0.0f);
  const Tensor logits = full.logits();
  const int64_t V = cfg.vocab_size;

  Generator gen(cfg, use_cache);
  ASSERT_EQ(gen.uses_cache(), use_cache);
  gen.params().initialize(11);
  for (int64_t n = 1; n <= t; ++n) {
    const std::vector<float> next =
        gen.next_logits(std::span<const int32_t>(tokens.data(), static_cast<size_t>(n)));
    ASSERT_EQ(int64_t(next.size()), V);
    EXPECT_LT(gen_rel_err(next.data(), logits.f32() + (n - 1) * V, V), 1e-5) << "prefix " << n;
  }
}

// Every prefix up to the whole context: with the cache, each call decodes one more token,
// and the last fills the cache to the model's context.
TEST(Generate, PrefixLogitsEqualFullForwardGpt2) {
  for (bool cache : {true, false})
    expect_prefix_logits_match(gen_tiny(ModelFamily::GPT2, false), cache);
}
TEST(Generate, PrefixLogitsEqualFullForwardLlamaGqa) {
  for (bool cache : {true, false})
    expect_prefix_logits_match(gen_tiny(ModelFamily::LLaMA, false), cache);
}
TEST(Generate, PrefixLogitsEqualFullForwardMoe) {
  for (bool cache : {true, false})
    expect_prefix_logits_match(gen_tiny(ModelFamily::LLaMA, true), cache);
}

ModelConfig gen_recipe_model(const std::string& name) {
  return load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/" + name + ".toml").model;
}

// A recipe's model with random weights: a 20-token prompt (one prefill), then 12 greedy
// tokens decoded one at a time from the cache. At every step the cached logits equal the
// full forward's (the --no-cache path), both pick the same token, and the logits are not
// trivial: they spread, and they move from one step to the next by far more than the
// tolerance (so a step that reused stale rows or the wrong position would show).
void gen_expect_cached_matches(const std::string& recipe) {
  const ModelConfig cfg = gen_recipe_model(recipe);
  Generator cached(cfg), full(cfg, false);
  ASSERT_TRUE(cached.uses_cache());
  cached.params().initialize(5);
  full.params().initialize(5);
  const int64_t V = cfg.vocab_size;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < 20; ++i) tokens.push_back(int32_t((i * 131 + 7) % V));
  std::mt19937_64 rng(0);
  std::vector<float> previous;
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> a = cached.next_logits(tokens), b = full.next_logits(tokens);
    ASSERT_EQ(int64_t(a.size()), V);
    EXPECT_LT(gen_rel_err(a.data(), b.data(), V), 1e-6) << recipe << " step " << step;
    const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
    EXPECT_GT(*hi - *lo, 1e-2f) << recipe << " step " << step;
    if (!previous.empty()) {
      EXPECT_GT(gen_rel_err(a.data(), previous.data(), V), 1e-3) << recipe << " step " << step;
    }
    previous = a;
    const int32_t next = pick_token(a, {}, rng);
    ASSERT_EQ(next, pick_token(b, {}, rng)) << recipe << " step " << step;
    tokens.push_back(next);
  }
}

TEST(Generate, CachedDecodeEqualsFullForwardGptTiny) {
  gen_expect_cached_matches("gpt-tiny");
}
TEST(Generate, CachedDecodeEqualsFullForwardLlamaTinyGqa) {
  ASSERT_LT(gen_recipe_model("llama-tiny").kv_heads(), gen_recipe_model("llama-tiny").n_head);
  gen_expect_cached_matches("llama-tiny");
}
TEST(Generate, CachedDecodeEqualsFullForwardMixtralTiny) {
  ASSERT_TRUE(gen_recipe_model("mixtral-tiny").is_moe());
  gen_expect_cached_matches("mixtral-tiny");
}

// The cache holds what it was given: the same next token after a prompt whose first token
// differs gives other logits, and a Generator fed an unrelated sequence starts again
// (prefill) instead of extending the cached one.
TEST(Generate, CacheRestartsOnAnotherSequence) {
  const ModelConfig cfg = gen_recipe_model("llama-tiny");
  Generator cached(cfg), full(cfg, false);
  cached.params().initialize(9);
  full.params().initialize(9);
  const std::vector<int32_t> a = {3, 14, 15, 92, 65, 35}, b = {4, 14, 15, 92, 65, 35};
  const std::vector<float> la = cached.next_logits(a), lb = cached.next_logits(b);
  EXPECT_GT(gen_rel_err(la.data(), lb.data(), cfg.vocab_size), 1e-3);
  const std::vector<float> ref = full.next_logits(b);
  EXPECT_LT(gen_rel_err(lb.data(), ref.data(), cfg.vocab_size), 1e-6);
  // A shorter prefix of b after b: prefill again, the full forward's logits.
  const std::vector<int32_t> b3(b.begin(), b.begin() + 3);
  const std::vector<float> l3 = cached.next_logits(b3), ref3 = full.next_logits(b3);
  EXPECT_LT(gen_rel_err(l3.data(), ref3.data(), cfg.vocab_size), 1e-6);
}

// Model::decode refuses more tokens than the cache has positions left (the generate command
// stops at the context before that).
TEST(Generate, DecodeRefusesPastTheContext) {
  ModelConfig cfg = gen_tiny(ModelFamily::GPT2, false);
  Model model(cfg, 1, cfg.max_seq_len);
  model.params().initialize(1);
  KvCache cache(cfg, cfg.max_seq_len);
  std::vector<int32_t> tokens(size_t(cfg.max_seq_len), 1);
  model.decode(cache, tokens);
  EXPECT_EQ(cache.length(), cfg.max_seq_len);
  const std::vector<int32_t> one = {2};
  EXPECT_THROW(model.decode(cache, one), std::exception);
  EXPECT_THROW(KvCache(cfg, cfg.max_seq_len + 1), std::exception);
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
