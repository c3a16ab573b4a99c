// The step line's throughput basis (issue 45): the FLOPs a token it counts are the model's
// own count and the planner's, and a GPU's peak is found by its name.
#include <gtest/gtest.h>

#include <string>

#include "model/model.h"
#include "plan/cost_model.h"
#include "recipe/recipe.h"

using namespace pentad;

TEST(Throughput, FlopsATokenAreTheModelsCount) {
  for (const char* recipe : {"gpt-tiny.toml", "llama-tiny.toml", "mixtral-tiny.toml"}) {
    const Config cfg = load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/" + recipe, {});
    const Model model(cfg.model, 2, cfg.train.seq_len);
    const double tokens = 2.0 * double(cfg.train.seq_len);
    EXPECT_DOUBLE_EQ(model_flops_per_token(cfg.model, double(cfg.train.seq_len)),
                     model.flops_per_micro_batch() / tokens)
        << recipe;
  }
}

TEST(Throughput, GpuPeaksByName) {
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA H200 (device 0), 139.8 GiB, sm_90"), 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3 (device 0)"), 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA GeForce RTX 4090"), 0.0);  // not in the table: MFU n/a
}
