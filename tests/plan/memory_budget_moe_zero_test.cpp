// The memory estimate (plan/memory_budget.h) of mixtures of experts (their parameters by
// hand, split over ep and etp, the large MoE recipes on their layout), of ZeRO's shares and
// of AdamW's state and ZeRO-3's parameters offloaded to the host or NVMe.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "memory_budget_test_util.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace {

using pentad::memory_budget_test_util::kRecipes;
using pentad::memory_budget_test_util::one_rank;

// moe-fine-tiny by hand (C 64, 2 KV heads of 16, dense width 256, vocabulary 512): layer 0
// dense, layers 1 and 2 MoE with 16 experts of width 32 and one shared expert of width 32.
TEST(MemoryBudget, MoeParametersByHand) {
  const Config cfg = load_recipe(kRecipes + "moe-fine-tiny.toml");
  const double attention = 2 * 64 * 64 + 2 * 32 * 64 + 2 * 64;  // q, o, k, v, two norms
  const double dense = attention + 3 * 256 * 64;
  const double experts = 16 * 3 * 32 * 64;
  const double moe = attention + 16 * 64 + 16 + experts + 3 * 32 * 64;  // router, bias, shared
  const double embeddings = 2 * 512 * 64 + 64;                          // untied, final norm
  const MemoryEstimate e = estimate_memory(cfg, one_rank());
  EXPECT_EQ(e.values, dense + 2 * moe + embeddings);
  EXPECT_EQ(e.expert_values, 2 * experts);
  EXPECT_GT(e.dispatch, 0);
  EXPECT_LT(e.dispatch, e.activations);

  const MemoryEstimate dense_model =
      estimate_memory(load_recipe(kRecipes + "llama-tiny.toml"), one_rank());
  EXPECT_EQ(dense_model.expert_values, 0);
  EXPECT_EQ(dense_model.dispatch, 0);
}

// Each expert-parallel rank holds n_experts / ep experts, each etp rank 1/etp of their width;
// with more ranks sending to it, a rank may receive more rows (worst case, dropless).
TEST(MemoryBudget, MoeExpertsSplitOverEpAndEtp) {
  const Config cfg = load_recipe(kRecipes + "mixtral-tiny.toml");
  const MemoryEstimate one = estimate_memory(cfg, one_rank());
  EXPECT_EQ(one.expert_values, 2 * 8 * 3 * 128 * 64);  // 2 layers of 8 SwiGLU experts
  for (auto [ep, etp] : {std::pair{2, 1}, {1, 2}, {2, 2}, {4, 1}}) {
    SCOPED_TRACE(fmt::format("ep {} etp {}", ep, etp));
    parallel::MeshConfig mesh = one_rank();
    mesh.dp = ep * etp;
    mesh.ep = ep;
    mesh.etp = etp;
    const MemoryEstimate e = estimate_memory(cfg, mesh);
    EXPECT_EQ(e.expert_values, one.expert_values / (ep * etp));
    EXPECT_EQ(e.values - e.expert_values, one.values - one.expert_values);
    EXPECT_GT(e.dispatch, one.dispatch);  // rows from ep x etp ranks
  }
  // GPT-2 experts: the up bias splits over etp, the down bias does not.
  const Config gpt = load_recipe(kRecipes + "gpt-tiny.toml",
                                 {"model.moe_layers=all", "model.n_experts=4", "model.top_k=2"});
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = mesh.etp = 2;
  const double per_expert = 2 * 256 * 64 + 256 + 64;
  EXPECT_EQ(estimate_memory(gpt, one_rank()).expert_values, 2 * 4 * per_expert);
  EXPECT_EQ(estimate_memory(gpt, mesh).expert_values, 2 * 4 * (2 * 128 * 64 + 128 + 64));
}

// The shipped large MoE recipes plan to fit an 80 GB GPU on the 64 ranks they name.
TEST(MemoryBudget, LargeMoeRecipesFitTheirLayout) {
  for (const char* name : {"mixtral-8x7b.toml", "qwen2-57b-a14b.toml"}) {
    SCOPED_TRACE(name);
    const Config cfg = load_recipe(kRecipes + name);
    const parallel::MeshConfig mesh = mesh_config(cfg, 64);
    EXPECT_EQ(mesh.ep, 8);
    const MemoryEstimate e = estimate_memory(cfg, mesh);
    EXPECT_GT(e.expert_values, 0.5 * e.values);
    EXPECT_LT(e.total(), 80e9);
    const std::string plan = describe_memory(cfg, mesh);
    for (const char* part : {"routed experts", "MoE dispatch buffers", "ep 8", "total"})
      EXPECT_NE(plan.find(part), std::string::npos) << plan << "\nmissing: " << part;
  }
}

// ZeRO-2 and -3 free device memory as they free host memory (the sparse arenas are CUDA
// virtual memory there): a CUDA estimate's gradients are the CPU's, and so are its
// parameters but for ZeRO-3's shares, backed in 2 MiB granules instead of 4 KiB pages;
// AdamW on the host holds none of its state on the device.
TEST(MemoryBudget, CudaZeroFreesLikeTheCpuAndHostAdamWHoldsNone) {
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = 2;
  auto estimate = [&](const std::string& device, const std::string& zero,
                      const std::string& offload) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml", {"train.device=" + device, "parallel.zero=" + zero,
                                                 "parallel.offload=" + offload}),
        mesh);
  };
  for (const std::string zero : {"2", "3"}) {
    const MemoryEstimate cpu = estimate("cpu", zero, "none"), cuda = estimate("cuda", zero, "none");
    EXPECT_EQ(cuda.gradients, cpu.gradients) << "zero " << zero;
    if (zero == "2") {
      EXPECT_EQ(cuda.parameters, cpu.parameters);
    }
  }
  const MemoryEstimate cuda3 = estimate("cuda", "3", "none");
  const double values = cuda3.values, f32 = 4;
  // gpt-tiny's whole parameter arena is less than a granule: on CUDA its shares back one.
  ASSERT_LT(values * f32, 2 * 1048576.0);
  const MemoryEstimate cpu3 = estimate("cpu", "3", "none");
  EXPECT_GT(cuda3.parameters, cpu3.parameters);
  // On the CPU: half the values, each of the 4 units' shares (embedding, 2 layers, final
  // norm) rounded out to pages.
  EXPECT_NEAR(cuda3.parameters - cpu3.parameters, 2 * 1048576.0 - values / 2 * f32, 4 * 2 * 4096.0);
  // GPT-2 small over dp 8: a layer's share (0.9 MiB) rounds out to one or two granules,
  // 13% over the shares in all; at most two granules a unit (the embedding, 12 layers, the
  // final norm).
  mesh.dp = 8;
  auto gpt2 = [&](const std::string& device) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt2-124m.toml", {"train.device=" + device, "parallel.zero=3"}),
        mesh);
  };
  EXPECT_GT(gpt2("cuda").parameters, gpt2("cpu").parameters);
  EXPECT_LT(gpt2("cuda").parameters, gpt2("cpu").parameters + 14 * 2 * 2 * 1048576.0);
  EXPECT_EQ(cuda3.optimizer, 2 * values / 2 * f32);  // ZeRO shares the moments
  EXPECT_EQ(estimate("cuda", "2", "cpu").optimizer, 0.0);
  EXPECT_EQ(estimate("cuda", "0", "cpu").optimizer, 0.0);
  EXPECT_EQ(estimate("cpu", "0", "cpu").optimizer, 2 * values * f32);  // the host is the device
  // AdamW's moments on NVMe: on CUDA updated on the host, so none on the device either; on
  // the CPU three sub-groups of m and v in (host = device) memory.
  auto nvme = [&](const std::string& device) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml",
                    {"train.device=" + device, "parallel.offload=nvme",
                     "parallel.offload_path=/tmp", "parallel.nvme_subgroup_kb=16"}),
        one_rank());
  };
  EXPECT_EQ(nvme("cuda").optimizer, 0.0);
  EXPECT_EQ(nvme("cpu").optimizer, 3 * 2 * 16 * 1024.0);
}

// ZeRO-3's shares in whole granules, by hand: granules of 100 bytes, 4 bytes a value.
// Stretches of 30, 30 and 100 dense values over Z = 2 lie at bytes [0, 120), [120, 240) and
// [240, 640). Rank 0's shares [0, 60), [120, 180) and [240, 440) back granules [0, 500);
// rank 1's [60, 120), [180, 240) and [440, 640) back [0, 300) and [400, 700): 600 bytes.
TEST(MemoryBudget, Zero3SharesAreBackedInWholeGranules) {
  EXPECT_EQ(zero3_backed_shares({{30, 0}, {30, 0}, {100, 0}}, 2, 1, 4, 100), 600.0);
  // Granules of one value: exactly the larger share (rank 1's 15 + 15 + 50 values).
  EXPECT_EQ(zero3_backed_shares({{30, 0}, {30, 0}, {100, 0}}, 2, 1, 4, 4), 320.0);
  // Experts over edp 1 (each rank holds them whole) after 50 dense values over Z 2:
  // rank 0 backs [0, 100) and [200, 400) of granules of 100 bytes.
  EXPECT_EQ(zero3_backed_shares({{50, 50}}, 2, 1, 4, 100), 300.0);
}

// ZeRO-2 on GPT-2 small over 4 ranks: the tied embedding's V x 768 values are one bucket
// (about 147 MiB, far beyond bucket_mb), two of them in flight, and the reduced shares S = N / 4;
// fewer gradient bytes per rank than stage 0's 4N. With a second S for the next
// micro-batch's reduction (the reducer kept one until it added into the bucket instead) the
// plan said 532 MiB against stage 0's 475 MiB.
TEST(MemoryBudget, ZeroTwoHoldsFewerGradientsThanNoZeroOnGpt2Small) {
  auto estimate = [](const std::string& zero) {
    const Config cfg = load_recipe(kRecipes + "gpt2-124m.toml", {"parallel.zero=" + zero});
    return estimate_memory(cfg, mesh_config(cfg, 4));
  };
  const MemoryEstimate none = estimate("0"), two = estimate("2");
  const ModelConfig m = load_recipe(kRecipes + "gpt2-124m.toml").model;
  const double f32 = 4, embedding = double(m.vocab_size) * double(m.d_model) * f32;
  EXPECT_EQ(none.gradients, none.values * f32);
  EXPECT_DOUBLE_EQ(two.gradients, 2 * embedding + two.values / 4 * f32);
  EXPECT_LT(two.gradients, none.gradients);
}

// ZeRO-3's parameter shares on NVMe on CUDA: no device memory holds the shares (as on the
// CPU), AdamW holds none either, and the host memory beside it holds three
// sub-groups of p, m and v, two slots of gradient staging and three upload slots of the
// largest share, more than the same run keeping the shares in device memory
// (offload_params = false: two tensors per sub-group, parameters and gradients staged).
TEST(MemoryBudget, CudaNvmeParameterSharesCountTheirHostStaging) {
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = 2;
  auto estimate = [&](const std::string& device, bool params) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml",
                    {"train.device=" + device, "parallel.zero=3", "parallel.offload=nvme",
                     "parallel.offload_path=/tmp", "parallel.nvme_subgroup_kb=16",
                     std::string("parallel.offload_params=") + (params ? "true" : "false")}),
        mesh);
  };
  const MemoryEstimate on = estimate("cuda", true), off = estimate("cuda", false);
  const double shares = on.values / 2, f32 = 4;
  EXPECT_EQ(on.parameters, estimate("cpu", true).parameters) << "no copy of the shares";
  // Kept in device memory, the shares cost their granule (gpt-tiny's whole arena is less
  // than one); on NVMe, the largest unit's share read ahead.
  EXPECT_LT(off.parameters - on.parameters, 2 * 1048576.0);
  EXPECT_GT(off.parameters - on.parameters, 2 * 1048576.0 - shares * f32);
  EXPECT_EQ(on.optimizer, 0.0);
  const double chunk = std::min(shares, double(size_t{1} << 20));
  const double subgroups = 3 * std::min(3 * shares * f32, 3 * 16 * 1024.0);
  EXPECT_GT(on.host, subgroups + 2 * chunk * f32) << "the upload slots are counted";
  EXPECT_LT(on.host, subgroups + 2 * chunk * f32 + 3 * shares * f32) << "each below a share";
  EXPECT_GT(off.host, 0.0);
  EXPECT_EQ(estimate("cpu", true).host, 0.0) << "on the CPU it is all in total()";
}

}  // namespace
