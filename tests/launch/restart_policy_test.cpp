// launch/restart_policy.h: the backoff schedule (exponential, capped, jittered by a seed),
// the restarts in a row that --max-restarts bounds, and progress that clears them.
#include "launch/restart_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace pentad::launch {
namespace {

TEST(RestartPolicy, ScheduleDoublesFromTheSecondRestartToTheCap) {
  const BackoffOptions o{100, 2.0, 60.0, 0.0};
  std::vector<double> waits;
  for (int n = 1; n <= 9; ++n) waits.push_back(RestartPolicy::base_wait_s(o, n));
  EXPECT_EQ(waits, (std::vector<double>{0, 2, 4, 8, 16, 32, 60, 60, 60}));
  EXPECT_EQ(RestartPolicy::base_wait_s(o, 10000), 60.0);  // no overflow far out
}

TEST(RestartPolicy, JitterIsBoundedAndFollowsTheSeed) {
  const BackoffOptions o{100, 2.0, 60.0, 0.25};
  auto schedule = [&](uint64_t seed) {
    RestartPolicy p(o, seed);
    std::vector<double> waits;
    for (int n = 1; n <= 8; ++n) waits.push_back(p.failed("dead, culprit rank 1", 10).wait_s);
    return waits;
  };
  const std::vector<double> a = schedule(7), b = schedule(7), c = schedule(8);
  EXPECT_EQ(a, b);  // the same seed, the same waits
  EXPECT_NE(a, c);
  EXPECT_EQ(a[0], 0.0);  // the first restart goes at once, jitter or not
  for (int n = 2; n <= 8; ++n) {
    const double base = RestartPolicy::base_wait_s(o, n);
    EXPECT_GE(a[n - 1], 0.75 * base) << n;
    EXPECT_LE(a[n - 1], 1.25 * base) << n;
  }
  bool jittered = false;  // not every wait exactly its base
  for (int n = 2; n <= 8; ++n) jittered = jittered || a[n - 1] != RestartPolicy::base_wait_s(o, n);
  EXPECT_TRUE(jittered);
}

TEST(RestartPolicy, GivesUpAfterMaxRestartsInARow) {
  RestartPolicy p({3, 2.0, 60.0, 0.0}, 1);
  for (int n = 1; n <= 3; ++n) {
    const RestartPolicy::Decision d = p.failed("dead, culprit rank 0", 12);
    EXPECT_FALSE(d.give_up) << n;
    EXPECT_EQ(d.in_a_row, n);
    EXPECT_EQ(d.wait_s, RestartPolicy::base_wait_s({3, 2.0, 60.0, 0.0}, n));
    // Each attempt resumes below the step it failed at and fails there again: no progress.
    EXPECT_FALSE(p.progressed(11));
    EXPECT_FALSE(p.progressed(12 + RestartPolicy::kClearSteps - 1));
  }
  const RestartPolicy::Decision d = p.failed("dead, culprit rank 0", 12);
  EXPECT_TRUE(d.give_up);
  EXPECT_EQ(d.in_a_row, 4);
  EXPECT_EQ(d.wait_s, 0.0);
}

TEST(RestartPolicy, TrainingPastTheFurthestStepClearsTheCount) {
  const BackoffOptions o{2, 2.0, 60.0, 0.0};
  RestartPolicy p(o, 1);
  EXPECT_EQ(p.failed("full disk", 40).wait_s, 0.0);
  EXPECT_EQ(p.failed("full disk", 35).wait_s, 2.0);  // the furthest step stays 40
  EXPECT_FALSE(p.progressed(40 + RestartPolicy::kClearSteps - 1));
  EXPECT_TRUE(p.progressed(40 + RestartPolicy::kClearSteps));
  EXPECT_EQ(p.in_a_row(), 0);
  EXPECT_FALSE(p.progressed(100));  // cleared once
  // A fault much later is a first again: at once, and the whole --max-restarts to spend.
  for (int n = 1; n <= 2; ++n) {
    const RestartPolicy::Decision d = p.failed("full disk", 500);
    EXPECT_FALSE(d.give_up);
    EXPECT_EQ(d.in_a_row, n);
    EXPECT_EQ(d.wait_s, RestartPolicy::base_wait_s(o, n));
  }
  EXPECT_TRUE(p.failed("full disk", 500).give_up);
}

TEST(RestartPolicy, StepsABeatMayNotHaveShownCountAsReached) {
  // Beats said step 12; up to 7 more may have passed unseen before the kill: a job that fails
  // at 19 on every attempt must not clear the count by reaching 15.
  RestartPolicy p({3, 2.0, 60.0, 0.0}, 1);
  EXPECT_EQ(p.failed("dead, culprit rank 1", 12, 7).past_step, 19);
  EXPECT_FALSE(p.progressed(19 + RestartPolicy::kClearSteps - 1));
  EXPECT_TRUE(p.progressed(19 + RestartPolicy::kClearSteps));
}

TEST(RestartPolicy, ANewCauseStartsItsOwnScheduleButCountsInTheRow) {
  RestartPolicy p({3, 2.0, 60.0, 0.0}, 1);
  p.failed("dead, culprit rank 1", 10);
  EXPECT_EQ(p.failed("dead, culprit rank 1", 10).wait_s, 2.0);
  const RestartPolicy::Decision d = p.failed("non-comm hang, culprit rank 2", 10);
  EXPECT_EQ(d.same_cause, 1);
  EXPECT_EQ(d.wait_s, 0.0);
  EXPECT_EQ(d.in_a_row, 3);
  EXPECT_TRUE(p.failed("dead, culprit rank 1", 10).give_up);
}

}  // namespace
}  // namespace pentad::launch
