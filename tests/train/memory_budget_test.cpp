// The memory estimate made from a recipe alone (train/memory_budget.h) against the arenas a
// model of that recipe really allocates, and the refusal it gives when the plan does not fit.
#include "train/memory_budget.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "train/recipe.h"

using namespace pentad;

namespace {

const std::string kRecipes = std::string(PENTAD_SOURCE_DIR) + "/recipes/";

parallel::MeshConfig one_rank() {
  parallel::MeshConfig mesh;
  mesh.tp = mesh.cp = mesh.dp = mesh.pp = 1;
  return mesh;
}

TEST(MemoryBudget, EstimateMatchesTheArenasOfOneRank) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"gpt-tiny.toml", {}},
      {"llama-tiny.toml", {}},
      {"gpt-tiny.toml", {"model.recompute=true"}},
      {"llama-tiny.toml", {"model.n_layer=3", "model.d_model=128", "train.micro_batch=3"}},
      {"llama-tiny.toml", {"model.tie_embeddings=true", "model.d_ff=200"}},
  };
  for (const auto& [recipe, overrides] : rows) {
    SCOPED_TRACE(recipe + " " + (overrides.empty() ? "" : overrides.front()));
    const Config cfg = load_recipe(kRecipes + recipe, overrides);
    Model model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
    const ParamStore& p = model.params();
    const double measured = double(4 * p.bytes() + model.activation_bytes());
    const MemoryEstimate e = estimate_memory(cfg, one_rank());
    EXPECT_EQ(e.values, double(p.numel()));
    EXPECT_NEAR(e.total() / measured, 1.0, 0.02)
        << "estimate " << e.total() << ", measured " << measured;
  }
}

TEST(MemoryBudget, RefusesFastNamingTheKeys) {
  const auto start = std::chrono::steady_clock::now();
  const Config cfg = load_recipe(kRecipes + "gpt-tiny.toml",
                                 {"model.n_layer=100000", "train.memory_limit_mb=1024"});
  try {
    check_memory(cfg, one_rank(), NodeShare{});
    ADD_FAILURE() << "100000 layers fit in 1 GiB";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : {"gpt-tiny.toml", "does not fit", "above train.memory_limit_mb = 1024",
                             "model.n_layer <= ", "parallel.tp x parallel.pp"})
      EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
}

TEST(MemoryBudget, TheLimitIsTheRanksShareOfTheMachine) {
  Config cfg = load_recipe(kRecipes + "gpt-tiny.toml");
  NodeShare node;
  node.ranks = 8;
  node.memory_bytes = 8 * 64.0 * 1024 * 1024;  // 64 MiB a rank: gpt-tiny fits
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
  node.memory_bytes = 8 * 4.0 * 1024 * 1024;  // 4 MiB a rank: it does not
  EXPECT_THROW(check_memory(cfg, one_rank(), node), Error);
  cfg.train.memory_limit_mb = 64;  // the key wins over the share
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
}

}  // namespace
