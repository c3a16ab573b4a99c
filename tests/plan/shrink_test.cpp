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

}  // namespace shrink_test
