// Adaptive kFkB's choice from measured stage times (parallel/pp/adaptive.h): it follows the
// link, respects every stage's own activation size under the memory limit, and predicts
// what the simulator does for the same costs. The collective halves (gathering the
// measures, timing the links) run under mpirun in tests/parallel/pipeline_test.cpp.
#include "parallel/pp/adaptive.h"

#include <gtest/gtest.h>

#include <limits>

namespace pentad::parallel::pp {
namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

TEST(Adaptive, SlowLinkGroupsFreeLinkDoesNot) {
  const ScheduleSpec spec{ScheduleKind::KFKB, 2, 16, 1, 1};
  const std::vector<StageMeasure> stages = {{1.0, 2.0, 100.0}, {1.0, 2.0, 100.0}};
  EXPECT_EQ(choose_adaptive_group(spec, stages, 0.0, kUnlimited).group, 1);
  const GroupChoice slow = choose_adaptive_group(spec, stages, 2.0, kUnlimited);
  EXPECT_GT(slow.group, 1);
  EXPECT_LT(slow.step_seconds, slow.one_f_one_b_seconds);
}

TEST(Adaptive, EachStagesActivationsCountAgainstTheLimit) {
  // kFkB keeps k * (p - s) micro-batches in flight on stage s. With 100 bytes each, a
  // 1500-byte limit lets stage 0 hold k = 7; if the last stage's micro-batches take 1000
  // bytes, it holds one group of one.
  const ScheduleSpec spec{ScheduleKind::KFKB, 2, 16, 1, 1};
  const std::vector<StageMeasure> even = {{1.0, 2.0, 100.0}, {1.0, 2.0, 100.0}};
  const std::vector<StageMeasure> heavy_last = {{1.0, 2.0, 100.0}, {1.0, 2.0, 1000.0}};
  const GroupChoice fits = choose_adaptive_group(spec, even, 2.0, 1500.0);
  EXPECT_GT(fits.group, 1);
  EXPECT_LE(fits.group, 7);
  EXPECT_EQ(choose_adaptive_group(spec, heavy_last, 2.0, 1500.0).group, 1);
}

TEST(Adaptive, PredictsTheSimulatedStepOfItsChoice) {
  // Unequal stages, forward and backward apart: the measures must reach the simulator in
  // stage order, forward as forward.
  const ScheduleSpec spec{ScheduleKind::KFKB, 3, 12, 1, 1};
  const std::vector<StageMeasure> stages = {{1.0, 2.5, 10.0}, {3.0, 4.0, 10.0}, {0.5, 6.0, 10.0}};
  const double link = 1.5;
  const GroupChoice choice = choose_adaptive_group(spec, stages, link, kUnlimited);
  SimCosts costs;
  costs.forward_seconds = {1.0, 3.0, 0.5};
  costs.backward_seconds = {2.5, 4.0, 6.0};
  costs.transfer_seconds = link;
  ScheduleSpec chosen = spec;
  chosen.group = choice.group;
  EXPECT_DOUBLE_EQ(choice.step_seconds, simulate(chosen, costs).step_seconds);
  EXPECT_DOUBLE_EQ(choice.one_f_one_b_seconds, simulate(spec, costs).step_seconds);
  for (int k = 1; k <= spec.micro_batches; ++k) {  // and no other k is faster
    ScheduleSpec other = spec;
    other.group = k;
    const SimResult r = simulate(other, costs);
    if (r.deadlock) continue;
    EXPECT_LE(choice.step_seconds, r.step_seconds * (1 + 1e-9)) << "k = " << k;
  }
}

}  // namespace
}  // namespace pentad::parallel::pp
