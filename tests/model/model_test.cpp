// Model-level properties that the PyTorch comparison does not cover.
#include "model/model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "core/params.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "train/trainer.h"

using namespace pentad;

namespace {

ModelConfig tiny(ModelFamily family) {
  ModelConfig cfg;
  cfg.family = family;
  cfg.n_layer = 3;
  cfg.d_model = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = family == ModelFamily::LLaMA ? 2 : 0;
  cfg.vocab_size = 97;
  cfg.max_seq_len = 16;
  cfg.tie_embeddings = family == ModelFamily::GPT2;
  return cfg;
}

// One step's gradients of a tiny batch; `on_ready` hears backward's reports (none: no
// listener).
std::vector<float> grads_of(ModelConfig cfg, bool recompute, float& loss, size_t& act_bytes,
                            const GradsReady& on_ready = {}) {
  cfg.recompute = recompute;
  const int64_t b = 2, t = 16;
  Model model(cfg, b, t);
  model.params().initialize(3);
  std::vector<int32_t> in(static_cast<size_t>(b * t)), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(splitmix64(i) % 97);
    tg[i] = static_cast<int32_t>(splitmix64(i + 1000) % 97);
  }
  model.params().zero_grads();
  loss = model.forward(in.data(), tg.data(), 1.0f / static_cast<float>(b * t));
  model.backward(true, on_ready);
  act_bytes = model.activation_bytes();
  const Tensor g = model.params().all_grads();
  return std::vector<float>(g.f32(), g.f32() + g.numel());
}

}  // namespace

class ModelFamilies : public ::testing::TestWithParam<ModelFamily> {};

// Recomputing each layer's activations in backward gives bitwise the same gradients
// while planning less activation memory.
TEST_P(ModelFamilies, RecomputeIsExactAndSavesMemory) {
  omp_set_num_threads(2);
  float loss_a = 0, loss_b = 0;
  size_t bytes_a = 0, bytes_b = 0;
  std::vector<float> a = grads_of(tiny(GetParam()), false, loss_a, bytes_a);
  std::vector<float> b = grads_of(tiny(GetParam()), true, loss_b, bytes_b);
  EXPECT_EQ(loss_a, loss_b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_LT(bytes_b, bytes_a);
  double norm = 0;
  for (float x : a) norm += static_cast<double>(x) * x;
  EXPECT_GT(norm, 0.0);  // the gradients are not trivially zero
}

INSTANTIATE_TEST_SUITE_P(Families, ModelFamilies,
                         ::testing::Values(ModelFamily::GPT2, ModelFamily::LLaMA));

// Backward reports the gradients final from each layer's first parameter on, moving towards
// the arena's start (data parallelism starts a bucket's reduction then), and between a
// layer's GEMMs repeats the offset last reported, so that reductions under way progress
// (a host reduction moves only inside these calls). The same gradients as with no listener.
TEST_P(ModelFamilies, BackwardReportsFinalGradientsAndPollsBetweenGemms) {
  omp_set_num_threads(2);
  const ModelConfig cfg = tiny(GetParam());
  float loss = 0;
  size_t act_bytes = 0;
  std::vector<int64_t> calls;
  const std::vector<float> heard =
      grads_of(cfg, false, loss, act_bytes, [&](int64_t offset) { calls.push_back(offset); });
  std::vector<int64_t> distinct;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(calls[i], calls[i - 1]) << "call " << i;  // never backwards
    }
    if (distinct.empty() || calls[i] != distinct.back()) distinct.push_back(calls[i]);
  }
  // The final norm, each layer, the embedding: one offset each, the last the arena's start.
  ASSERT_EQ(distinct.size(), size_t(cfg.n_layer + 2));
  EXPECT_EQ(distinct.back(), 0);
  // Polls: three inside each layer after the first one's report.
  EXPECT_EQ(calls.size(), distinct.size() + size_t(3 * cfg.n_layer));
  const std::vector<float> quiet = grads_of(cfg, false, loss, act_bytes);
  ASSERT_EQ(quiet.size(), heard.size());
  EXPECT_EQ(std::memcmp(quiet.data(), heard.data(), quiet.size() * sizeof(float)), 0);
}

// Any slice of a parameter initialises to the same values as that slice of the whole
// parameter: layouts that shard parameters start from the same global weights.
TEST(Params, ShardedInitialisationIsTheSliceOfTheWhole) {
  ParamStore whole, part;
  whole.add("w", Shape{6, 10}, Init::Normal, 0.02f, true);
  // Hold columns [4, 7) of the (6, 10) matrix: shard along dim 1.
  part.add_shard("w", Shape{6, 10}, Init::Normal, 0.02f, true, 1, 4, 3);
  whole.allocate();
  whole.initialize(11);
  part.allocate();
  part.initialize(11);
  const float* w = whole.param(0).f32();
  const float* p = part.param(0).f32();
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(p[r * 3 + c], w[r * 10 + 4 + c]);
  // And the initialisation has the requested spread.
  double sq = 0;
  for (int i = 0; i < 60; ++i) sq += static_cast<double>(w[i]) * w[i];
  EXPECT_NEAR(std::sqrt(sq / 60), 0.02, 0.006);
}

// Mixed precision: a BF16 compute copy follows the F32 master values (round to nearest
// even) at the same element offsets, after every refresh.
TEST(Params, ComputeCopyFollowsTheMasterValues) {
  ParamStore store;
  store.add("a", Shape{3, 7}, Init::Normal, 0.5f, true);
  store.add("b", Shape{5}, Init::Ones, 0.0f, false);
  store.allocate({Device::CPU, DType::BF16});
  store.initialize(5);
  kernels::refresh_weights(store);
  EXPECT_EQ(store.compute_copy_bytes() >= size_t(store.numel()) * 2, true);
  auto check = [&] {
    for (int id = 0; id < 2; ++id) {
      const Tensor w = store.weight(id), p = store.param(id);
      ASSERT_EQ(w.dtype, DType::BF16);
      ASSERT_EQ(w.shape, p.shape);
      const uint16_t* bits = w.as<uint16_t>();
      for (int64_t i = 0; i < p.numel(); ++i)
        EXPECT_EQ(bits[i], float_to_bf16(p.f32()[i])) << "parameter " << id << " element " << i;
    }
  };
  check();
  store.param(0).f32()[4] = 1.2345f;  // the optimizer writes the master ...
  kernels::refresh_weights(store);    // ... and the copy follows
  check();
  // F32 compute reads the master itself.
  ParamStore plain;
  plain.add("a", Shape{4}, Init::Normal, 0.5f, true);
  plain.allocate();
  EXPECT_EQ(plain.weight(0).data, plain.param(0).data);
  EXPECT_EQ(plain.compute_copy_bytes(), 0u);
}
