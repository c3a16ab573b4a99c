// The layout search on several threads (plan/plan_search.h, search_layouts' `threads`): the
// same rows, in the same order with the same predictions, the same counts, and the same
// refusal when nothing passes, as on one. The ThreadSanitizer build runs it too
// (tests/CMakeLists.txt, threads_tests).
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "plan/plan_search.h"
#include "plan_test_util.h"

namespace pentad {
namespace {

using plan_test_util::gpt;
using plan_test_util::h100;
using plan_test_util::nvswitch;

TEST(PlanThreads, FourThreadsFindWhatOneFinds) {
  const Config cfg = gpt({"parallel.dp=4"});
  const PlanSearch one = search_layouts(cfg, 4, {}, 80e9, h100(), nvswitch(), 1);
  const PlanSearch four = search_layouts(cfg, 4, {}, 80e9, h100(), nvswitch(), 4);
  ASSERT_GT(one.rows.size(), 100u);  // a search wide enough for every thread to have degrees
  ASSERT_EQ(four.rows.size(), one.rows.size());
  for (size_t i = 0; i < one.rows.size(); ++i) {
    ASSERT_EQ(four.rows[i].layout.label(), one.rows[i].layout.label()) << "row " << i;
    ASSERT_EQ(four.rows[i].prediction.step_seconds, one.rows[i].prediction.step_seconds);
    ASSERT_EQ(four.rows[i].prediction.memory_bytes, one.rows[i].prediction.memory_bytes);
  }
  EXPECT_EQ(four.considered, one.considered);
  EXPECT_EQ(four.refused, one.refused);
  EXPECT_EQ(four.pruned, one.pruned);
  EXPECT_EQ(four.over_memory, one.over_memory);
  EXPECT_GT(one.refused + one.pruned, 0);  // refusals were met and merged too
}

// What a search that ends in an error says: no layout fits (the least memory and its
// layout), or none passes the checks (the first refusal met in one thread's order).
TEST(PlanThreads, FourThreadsRefuseAsOneDoes) {
  auto message = [](const Config& cfg, const std::string& layout, double memory, int threads) {
    try {
      search_layouts(cfg, 4, parse_layout(layout, 4), memory, h100(), nvswitch(), threads);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Config cfg = gpt({"parallel.dp=4"});
  const std::string small = message(cfg, "", 1e6, 1);
  EXPECT_NE(small.find("the smallest needs"), std::string::npos) << small;
  EXPECT_EQ(message(cfg, "", 1e6, 4), small);
  const std::string none = message(cfg, "mb=3", 80e9, 1);
  EXPECT_NE(none.find("passes the recipe's checks"), std::string::npos) << none;
  EXPECT_EQ(message(cfg, "mb=3", 80e9, 4), none);
}

}  // namespace
}  // namespace pentad
