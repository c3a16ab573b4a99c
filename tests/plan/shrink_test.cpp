// After ranks are lost (plan/shrink.h): the counts searched, and `pentad plan --after-loss`'s
// three layouts on one H100 node for the small GPT-2 of plan_test_util.
#include "plan/shrink.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "plan_test_util.h"

using namespace pentad;

namespace shrink_test {

using pentad::plan_test_util::gpt;

PlanTarget one_node(int ranks) {
  const Cluster c = cluster_preset("dgx-h100", ranks);
  return {c.machine, c.topology, 80e9};
}

TEST(Shrink, CountsEveryCountWhenSmallAndTheLikelyOnesAtScale) {
  EXPECT_EQ(shrink_counts(7), (std::vector<int>{7, 6, 5, 4, 3, 2, 1}));
  const std::vector<int> big = shrink_counts(1023);
  for (int n : {1023, 1019, 1022, 1016, 768, 512, 256})
    EXPECT_NE(std::find(big.begin(), big.end(), n), big.end()) << n;
  EXPECT_LT(big.size(), 40u);
  EXPECT_TRUE(std::is_sorted(big.rbegin(), big.rend()));
}

TEST(Shrink, AfterLossKeepsTheGlobalBatchAndBeatsNoReplicaToSpare) {
  // dp 1 on 8 ranks: one replica fewer is impossible, the re-plan runs on what remains.
  const Config cfg = gpt({"parallel.dp=1"});
  const nlohmann::json j = nlohmann::json::parse(
      describe_after_loss(cfg, 8, 1, parse_layout("tp=8,dp=1", 8), one_node, true));
  EXPECT_EQ(j["before"]["ranks"], 8);
  EXPECT_TRUE(j["one_replica_fewer"].is_null());
  EXPECT_NE(j["one_replica_fewer_refused"].get<std::string>().find("dp 1"), std::string::npos);
  const auto& after = j["replanned"];
  EXPECT_GE(after["ranks"].get<int>(), 1);
  EXPECT_LE(after["ranks"].get<int>(), 7);
  EXPECT_GT(after["tokens_per_second"].get<double>(), 0);
  EXPECT_EQ(j["global_batch"].get<double>(), 8);
  // The table says the same, and a loss of every rank is refused naming --after-loss.
  const std::string table =
      describe_after_loss(cfg, 8, 1, parse_layout("tp=8,dp=1", 8), one_node, false);
  EXPECT_NE(table.find("keeping the global batch of 8 sequences"), std::string::npos) << table;
  EXPECT_NE(table.find(after["layout"].get<std::string>()), std::string::npos) << table;
  EXPECT_THROW(describe_after_loss(cfg, 8, 8, {}, one_node, false), Error);
}

TEST(Shrink, OneReplicaFewerShrinksTheGlobalBatchWhereGradAccumCannotMakeItUp) {
  // dp 8 x ga 1: dp 7 cannot hold 8 sequences; the batch shrinks to 7, as --exclude-culprit.
  const Config cfg = gpt({"parallel.dp=8", "train.grad_accum=1", "train.global_batch=8"});
  std::string why;
  const auto fewer =
      one_replica_fewer(cfg, 8, parse_layout("tp=1,dp=8,mb=1,ga=1", 8), one_node, &why);
  ASSERT_TRUE(fewer.has_value()) << why;
  EXPECT_EQ(fewer->layout.dp, 7);
  EXPECT_EQ(fewer->layout.micro_batch * fewer->layout.grad_accum * fewer->layout.dp, 7);
}

// A slowed link (Topology::slow_link) costs a layout only where one of the groups it prices
// holds the link between ring neighbours or adjacent stages, whichever replica's it is.
TEST(Shrink, ASlowLinkCostsOnlyTheLayoutsWhoseGroupsHoldIt) {
  auto step = [](std::vector<std::string> degrees, int a, int b) {
    degrees.push_back("train.grad_accum=8");
    const Config cfg = gpt(degrees);
    parallel::Topology topo = parallel::uniform_cluster(1, 4, 450, 3e-6, 450, 3e-6);
    if (a >= 0) topo.slow_link(a, b, 100);
    return predict_step(cfg, mesh_config(cfg, 4), cluster_preset("dgx-h100", 4).machine, topo)
        .step_seconds;
  };
  // dp 4: a ring 0-1-2-3; 1-2 on it, 0-2 not.
  const std::vector<std::string> dp4 = {"parallel.dp=4"};
  EXPECT_GT(step(dp4, 1, 2), step(dp4, -1, -1));
  EXPECT_EQ(step(dp4, 0, 2), step(dp4, -1, -1));
  // tp 2 x dp 2: tp {0,1} {2,3}, dp {0,2} {1,3}; 1-3 is the second replica's dp link, 2-3 the
  // second tp group's.
  const std::vector<std::string> tp_dp = {"parallel.tp=2", "parallel.dp=2"};
  EXPECT_EQ(step(tp_dp, 1, 2), step(tp_dp, -1, -1));
  EXPECT_GT(step(tp_dp, 1, 3), step(tp_dp, -1, -1));
  EXPECT_GT(step(tp_dp, 2, 3), step(tp_dp, -1, -1));
  // pp 2 x dp 2: pipelines 0-2 and 1-3, dp {0,1} {2,3}; 1-3 is the second pipeline's link.
  const std::vector<std::string> pp_dp = {"parallel.pp=2", "parallel.dp=2"};
  EXPECT_EQ(step(pp_dp, 1, 2), step(pp_dp, -1, -1));
  EXPECT_GT(step(pp_dp, 1, 3), step(pp_dp, -1, -1));
}

}  // namespace shrink_test
