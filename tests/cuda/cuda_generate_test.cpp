// Generation on the GPU against the CPU: the tiny recipes' models (GPT-2, LLaMA with
// grouped-query attention, Mixtral's routed experts) with the same random weights decode a
// 20-token prompt (one prefill) and 12 greedy tokens, on the CPU in fp32 (the reference,
// itself tested against the training forward in tests/model/generate_test.cpp) and on the
// GPU with the key/value cache and without it (the training forward run again per token).
// fp32: every step's logits within 1e-4 (norm-wise relative) of the CPU's and the same
// greedy token; bf16: within 3e-2 (weights and activations rounded to 8 bits of mantissa).
// The sequence follows the CPU's picks, so a bf16 near-tie cannot fork it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "model/generate.h"
#include "recipe/recipe.h"
#include "tests/cuda/train_test_util.h"

namespace pentad {
namespace {

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

struct GenCase {
  const char* recipe;
  DType dtype;
};

void PrintTo(const GenCase& c, std::ostream* os) {
  *os << c.recipe << "_" << dtype_name(c.dtype);
}

class CudaGenerate : public ::testing::TestWithParam<GenCase> {
 protected:
  void SetUp() override {
    if (!cuda_train::have_device()) GTEST_SKIP() << "no CUDA device";
    select_cuda_device(0);
  }
};

TEST_P(CudaGenerate, DecodeMatchesCpu) {
  const GenCase& c = GetParam();
  const ModelConfig cfg =
      load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/" + c.recipe + ".toml").model;
  const Placement gpu{Device::CUDA, c.dtype};
  Generator cpu(cfg), cached(cfg, true, gpu), full(cfg, false, gpu);
  for (Generator* g : {&cpu, &cached, &full}) {
    g->params().initialize(5);
    g->reset();
  }
  const double tol = c.dtype == DType::F32 ? 1e-4 : 3e-2;
  const int64_t V = cfg.vocab_size;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < 20; ++i) tokens.push_back(int32_t((i * 131 + 7) % V));
  std::mt19937_64 rng(0);
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> ref = cpu.next_logits(tokens);
    const std::vector<float> a = cached.next_logits(tokens), b = full.next_logits(tokens);
    ASSERT_EQ(int64_t(a.size()), V);
    ASSERT_EQ(int64_t(b.size()), V);
    EXPECT_LT(rel_err(a, ref), tol) << "cached, step " << step;
    EXPECT_LT(rel_err(b, ref), tol) << "no cache, step " << step;
    const int32_t next = pick_token(ref, {}, rng);
    if (c.dtype == DType::F32) {
      EXPECT_EQ(pick_token(a, {}, rng), next) << "cached, step " << step;
      EXPECT_EQ(pick_token(b, {}, rng), next) << "no cache, step " << step;
    }
    tokens.push_back(next);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, CudaGenerate,
    ::testing::Values(GenCase{"gpt-tiny", DType::F32}, GenCase{"llama-tiny", DType::F32},
                      GenCase{"mixtral-tiny", DType::F32}, GenCase{"gpt-tiny", DType::BF16},
                      GenCase{"llama-tiny", DType::BF16}, GenCase{"mixtral-tiny", DType::BF16}));

}  // namespace
}  // namespace pentad
