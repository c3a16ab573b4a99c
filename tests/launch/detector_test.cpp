// The supervisor's decisions (launch/detector.h) on synthetic beats: each fault class with its
// culprit and first sign, the thresholds learnt from the step time, and a healthy run (steps
// with jitter) that must not be flagged.
#include "launch/detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

using nlohmann::json;
using pentad::launch::Detection;
using pentad::launch::Detector;

namespace {

constexpr int kWorld = 4;
const std::vector<int> kEveryone{0, 1, 2, 3};

json hello(int rank) {
  return {{"type", "hello"},     {"rank", rank},        {"world", kWorld}, {"pid", 0},
          {"host", "elsewhere"}, {"out_dir", "runs/x"}, {"attempt", 0},    {"resume_step", 0}};
}

json beat(int rank, int64_t step, const std::string& phase, double step_s = 0.1,
          double wait_s = 0.0) {
  return {{"type", "beat"},         {"rank", rank},   {"t", 0.0},
          {"step", step},           {"phase", phase}, {"step_seconds", step_s},
          {"wait_seconds", wait_s}, {"ckpt_step", -1}};
}

json waiting(int rank, int64_t step, const std::string& comm, int64_t seq, double since_s,
             const std::vector<int>& members) {
  json b = beat(rank, step, "wait");
  b["wait"] = {{"comm", comm},
               {"kind", "all_reduce"},
               {"seq", seq},
               {"since_s", since_s},
               {"members", members}};
  return b;
}

void feed(Detector& d, const json& msg, double now) {
  std::string error;
  ASSERT_GE(d.message(msg, now, &error), 0) << error;
}

// Four ranks that said hello and ran steps 1..10 of 0.1 s each, on the supervisor's clock
// t = 0..1.
Detector healthy_run() {
  Detector d({});
  for (int r = 0; r < kWorld; ++r) feed(d, hello(r), 0);
  for (int step = 1; step <= 10; ++step)
    for (int r = 0; r < kWorld; ++r) feed(d, beat(r, step, "compute", 0.1, 0.0), 0.1 * step);
  return d;
}

// From t = 1, ranks 0, 1, 3 block in dp's all-reduce #10 (entered at t = 1) and keep
// beating until `until`; rank 2 beats as `rank2` says.
template <typename Rank2>
void block_all_but_rank2(Detector& d, double until, Rank2 rank2) {
  for (double t = 1.0; t <= until + 1e-9; t += 0.1) {
    for (int r : {0, 1, 3}) feed(d, waiting(r, 10, "dp", 10, t - 1.0, kEveryone), t);
    rank2(t);
  }
}

// The attempt's first steps after its warm-up are kept apart from the bounded history: the
// step time before a fault whose first sign came late.
TEST(Detector, KeepsTheAttemptsFirstSteps) {
  Detector d = healthy_run();
  for (int step = 11; step <= 40; ++step)
    for (int r = 0; r < kWorld; ++r) feed(d, beat(r, step, "compute", 1.0), 0.1 * step);
  for (const auto& [rank, rs] : d.ranks()) {
    ASSERT_EQ(rs.early.size(), Detector::kEarlySteps) << rank;
    EXPECT_EQ(rs.early.front().step, 2) << rank;  // step 1 warms up
    EXPECT_EQ(rs.early.back().step, 6) << rank;
    EXPECT_EQ(rs.early.back().step_seconds, 0.1) << rank;
    EXPECT_EQ(rs.history.front().step, 21) << rank;
  }
}

TEST(Detector, ThresholdsComeFromTheMedianStepTime) {
  Detector fresh({});
  EXPECT_DOUBLE_EQ(fresh.hang_threshold_s(), 10.0);  // 5 x the 2 s floor before any step
  Detector d = healthy_run();
  EXPECT_NEAR(d.median_step_seconds(), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(d.hang_threshold_s(), 2.0);  // the floor: 5 x 0.1 s is less
  for (int r = 0; r < kWorld; ++r) feed(d, beat(r, 11, "compute", 1.0), 1.1);
  for (int r = 0; r < kWorld; ++r) feed(d, beat(r, 12, "compute", 1.0), 1.2);
  // Each rank's median over its last 20 steps is still 0.1 s; after 10 more at 1 s, 1 s.
  EXPECT_NEAR(d.median_step_seconds(), 0.1, 1e-12);
  for (int step = 13; step <= 30; ++step)
    for (int r = 0; r < kWorld; ++r) feed(d, beat(r, step, "compute", 1.0), 0.1 * step);
  EXPECT_DOUBLE_EQ(d.hang_threshold_s(), 5.0);
}

TEST(Detector, RankComputingWhileTheOthersWaitIsANonCommHang) {
  Detector d = healthy_run();
  block_all_but_rank2(d, 2.9, [&](double t) { feed(d, beat(2, 10, "compute"), t); });
  EXPECT_FALSE(d.check(2.95).has_value());  // 1.95 s < the 2 s threshold
  block_all_but_rank2(d, 3.2, [&](double t) { feed(d, beat(2, 10, "compute"), t); });
  std::optional<Detection> found = d.check(3.2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
  EXPECT_NEAR(found->first_sign_at, 1.0, 1e-9);  // when the longest waiter entered
  EXPECT_FALSE(d.check(3.3).has_value());        // reported once
}

// A rank blocked on its checkpoint's disk work (phase "checkpoint") is given 10 x the
// threshold, at least 30 s: a loaded disk is not a hang, a hung one is still named.
TEST(Detector, RankBlockedOnItsCheckpointIsGivenLongerThanAHang) {
  Detector d = healthy_run();
  block_all_but_rank2(d, 30.9, [&](double t) { feed(d, beat(2, 10, "checkpoint"), t); });
  EXPECT_FALSE(d.check(30.9).has_value());  // 29.9 s of the 30
  block_all_but_rank2(d, 31.1, [&](double t) { feed(d, beat(2, 10, "checkpoint"), t); });
  std::optional<Detection> found = d.check(31.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
  EXPECT_NE(found->reason.find("checkpoint"), std::string::npos) << found->reason;
  // Silent while it writes (a stopped process): the silence rule, not the disk's grace.
  Detector quiet = healthy_run();
  feed(quiet, beat(2, 10, "checkpoint"), 1.0);
  block_all_but_rank2(quiet, 3.2, [](double) {});
  found = quiet.check(3.2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

// Rank 2's checkpoint write held the others 5 s in dp's all-reduce #10; it ends, the
// collective completes, and rank 2's next beat (compute, #10 done) arrives before the
// others' next ones, which still show the wait they have just left. No verdict from them
// (before: a non-comm hang of rank 2); a member that says it is done with an older
// collective is still named, and a "done" report that is not fresh no longer holds the
// verdict off.
TEST(Detector, WaitersBeatOlderThanTheCulpritsCompletionIsNoVerdict) {
  auto finished = [](int64_t seq) {
    json b = beat(2, 10, "compute");
    b["done"] = {{"dp", seq}, {"world", 3}};
    return b;
  };
  Detector d = healthy_run();
  block_all_but_rank2(d, 6.0, [&](double t) { feed(d, beat(2, 10, "checkpoint"), t); });
  feed(d, finished(10), 6.05);
  EXPECT_FALSE(d.check(6.06).has_value());
  EXPECT_EQ(d.ranks().at(2).done.at("dp").seq, 10);

  Detector older = healthy_run();
  block_all_but_rank2(older, 6.0, [&](double t) { feed(older, beat(2, 10, "checkpoint"), t); });
  feed(older, finished(9), 6.05);
  std::optional<Detection> found = older.check(6.06);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});

  // The others still wait 1 s after rank 2 said it completed #10 (numbers that do not line
  // up): judged as before.
  block_all_but_rank2(d, 7.1, [&](double t) { feed(d, finished(10), t); });
  found = d.check(7.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->culprit, std::vector<int>{2});

  // The stale beat is the one that would be named: ranks 0, 2 and 3 have completed #10 and
  // wait in the next collective, rank 1's last beat still shows #10 (before: a comm hang of
  // rank 1). Its next beat, in the same collective as the others, clears it.
  Detector moved = healthy_run();
  block_all_but_rank2(moved, 6.0, [&](double t) { feed(moved, beat(2, 10, "checkpoint"), t); });
  for (int r : {0, 2, 3}) {
    json b = waiting(r, 10, "dp", 11, 0.0, kEveryone);
    b["done"] = {{"dp", 10}};
    feed(moved, b, 6.05);
  }
  EXPECT_FALSE(moved.check(6.06).has_value());
  feed(moved, waiting(1, 10, "dp", 11, 0.0, kEveryone), 6.1);
  EXPECT_FALSE(moved.check(6.1).has_value());
}

TEST(Detector, RankInAnotherCollectiveIsACommHang) {
  Detector d = healthy_run();
  block_all_but_rank2(d, 3.2, [&](double t) {
    feed(d, waiting(2, 10, "tp", 4, t - 1.2, {2, 3}), t);
  });
  std::optional<Detection> found = d.check(3.2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

// The culprit blocked in a receive of its own since before the others' all-reduce (what
// train.inject_fault = commhang does): the collective most ranks wait in is judged, so the
// culprit is rank 2, not a member of rank 2's receive that waits elsewhere.
TEST(Detector, CulpritBlockedLongerElsewhereIsStillTheCulprit) {
  Detector d = healthy_run();
  block_all_but_rank2(d, 3.2, [&](double t) {
    feed(d, waiting(2, 10, "world", 1, t - 0.8, kEveryone), t);  // entered at t = 0.2
  });
  std::optional<Detection> found = d.check(3.2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

// The culprit's own wait passes the threshold first (it entered it first, alone): the
// collective the others wait in is still the one judged (seen in a commhang trial).
TEST(Detector, CulpritPastTheThresholdFirstIsStillTheCulprit) {
  Detector d = healthy_run();
  for (double t = 1.0; t <= 3.05 + 1e-9; t += 0.05) {
    for (int r : {0, 1, 3}) feed(d, waiting(r, 10, "dp", 11, t - 1.1, kEveryone), t);
    feed(d, waiting(2, 10, "world", 8, t - 1.0, kEveryone), t);  // at 1.0, the others 1.1
  }
  std::optional<Detection> found = d.check(3.05);  // only rank 2's wait is past 2 s
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

TEST(Detector, EveryMemberInTheSameCollectiveBlamesTheLink) {
  Detector d = healthy_run();
  block_all_but_rank2(d, 3.2,
                      [&](double t) { feed(d, waiting(2, 10, "dp", 10, t - 1.0, kEveryone), t); });
  std::optional<Detection> found = d.check(3.2);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm hang");
  EXPECT_EQ(found->culprit, kEveryone);
}

TEST(Detector, SilentRankIsUnresponsiveEvenWhenNoOneWaits) {
  Detector d = healthy_run();
  for (double t = 1.0; t <= 3.1; t += 0.1)
    for (int r : {0, 1, 2}) feed(d, beat(r, 10, "compute"), t);  // rank 3: last beat at t = 1
  EXPECT_FALSE(d.check(2.9).has_value());
  std::optional<Detection> found = d.check(3.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{3});
  EXPECT_NEAR(found->latency_s(), 2.1, 1e-9);
}

TEST(Detector, SilentMemberOfTheWaitIsTheCulpritWhateverItsLastPhase) {
  Detector d = healthy_run();
  feed(d, waiting(2, 10, "dp", 10, 0.0, kEveryone), 1.0);  // stopped inside the collective
  block_all_but_rank2(d, 2.5, [](double) {});
  std::optional<Detection> found = d.check(2.5);  // wait 1.5 s, silence 1.5 s: not yet
  EXPECT_FALSE(found.has_value());
  block_all_but_rank2(d, 3.1, [](double) {});
  found = d.check(3.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

// Stopped right after its last beat showed it in the previous collective (#9): silent, so
// a non-comm hang, not a comm hang in #9 (seen in a SIGSTOP trial, bench/fault_bench.py).
TEST(Detector, SilentMemberLastSeenInAnotherCollectiveIsANonCommHang) {
  Detector d = healthy_run();
  feed(d, waiting(2, 10, "dp", 9, 0.0, kEveryone), 1.0);
  block_all_but_rank2(d, 3.1, [](double) {});
  std::optional<Detection> found = d.check(3.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang");
  EXPECT_EQ(found->culprit, std::vector<int>{2});
}

TEST(Detector, ClosedConnectionWithoutByeIsDeadButAByeIsNot) {
  Detector d = healthy_run();
  feed(d, {{"type", "bye"}, {"rank", 0}, {"status", "done"}, {"message", ""}}, 1.05);
  d.vanished(0, 1.06);
  EXPECT_FALSE(d.check(1.07).has_value());
  d.vanished(3, 1.08);
  d.vanished(1, 1.09);  // the launcher taking the others down after the first
  std::optional<Detection> found = d.check(1.1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "dead");
  EXPECT_EQ(found->culprit, std::vector<int>{3});
  EXPECT_NEAR(found->first_sign_at, 1.0, 1e-9);  // its last beat
}

TEST(Detector, ReportedErrorNamesItsRank) {
  Detector d = healthy_run();
  feed(d, {{"type", "bye"}, {"rank", 2}, {"status", "error"}, {"message", "out of memory"}}, 1.2);
  std::optional<Detection> found = d.check(1.3);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->culprit, std::vector<int>{2});
  EXPECT_NE(found->reason.find("out of memory"), std::string::npos);
  EXPECT_EQ(d.launcher_failed(1, 1.4).culprit, std::vector<int>{2});
}

TEST(Detector, SlowRankThatTheOthersWaitForIsReportedOnce) {
  Detector d = healthy_run();
  for (int step = 11; step <= 19; ++step)
    for (int r = 0; r < kWorld; ++r)
      feed(d, r == 1 ? beat(1, step, "compute", 0.31, 0.0) : beat(r, step, "compute", 0.31, 0.2),
           0.3 * step);
  EXPECT_FALSE(d.check(5.8).has_value());  // nine slow steps of the ten needed
  for (int r = 0; r < kWorld; ++r)
    feed(d, r == 1 ? beat(1, 20, "compute", 0.31, 0.0) : beat(r, 20, "compute", 0.31, 0.2), 6.0);
  std::optional<Detection> found = d.check(6.0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm slow");
  EXPECT_EQ(found->culprit, std::vector<int>{1});
  EXPECT_NEAR(found->first_sign_at, 3.3, 1e-9);  // the first of the ten slow steps
  EXPECT_FALSE(d.check(6.1).has_value());
}

// A step as the trainer's beats carry it ("recent": step, seconds, wait, CPU outside waits).
json step_beat(int rank, int64_t step, double seconds, double wait, double cpu) {
  json b = beat(rank, step, "compute", seconds, wait);
  b["recent"] = json::array({json::array({step, seconds, wait, cpu})});
  return b;
}

// Rank 2 computes 6 ms where the others compute 1.2 ms; the others' waits for it fall on
// either side of a step boundary (a checkpoint save shifts them): 1 ms on even steps, 9 on
// odd ones. Summed over the steps they are the excess: slow. Without any wait it is not.
// Steps of 7.5 ms, 10 ms apart: named only once it has been slow for Detector::kSlowSeconds,
// every check running (10 slow steps of a few milliseconds are a VM's stolen core as often as
// a slow rank); a step at the others' pace starts the count again.
TEST(Detector, SlowRankWhoseWaitsShiftBetweenStepsIsReportedAndOneNobodyWaitsForIsNot) {
  for (bool others_wait : {true, false}) {
    Detector d({});
    for (int r = 0; r < kWorld; ++r) feed(d, hello(r), 0);
    std::optional<Detection> found;
    int found_at = 0;
    for (int step = 1; step <= 400 && !found; ++step) {
      const bool slow = step != 30;  // one step at the others' pace
      for (int r = 0; r < kWorld; ++r) {
        const double wait = r == 2 || !others_wait || !slow ? 0.0 : step % 2 ? 0.009 : 0.001;
        feed(d, step_beat(r, step, 0.0075, wait, r == 2 && slow ? 0.006 : 0.0012), 0.01 * step);
      }
      found = d.check(0.01 * step);
      found_at = step;
    }
    ASSERT_EQ(found.has_value(), others_wait);
    if (others_wait) {
      EXPECT_EQ(found->culprit, std::vector<int>{2});
      // From step 31 on (the step at the others' pace ended the first count), for
      // kSlowSeconds.
      EXPECT_NEAR(found->first_sign_at, 0.31, 1e-9);
      EXPECT_EQ(found_at, 31 + std::lround(Detector::kSlowSeconds / 0.01));
    }
  }
}

TEST(Detector, HealthyJitterIsNoFault) {
  Detector d({});
  for (int r = 0; r < kWorld; ++r) feed(d, hello(r), 0);
  // Compute 0.10..0.13 s per rank, rotating who is slowest; the others wait the difference.
  for (int step = 1; step <= 200; ++step) {
    const double now = 0.13 * step;
    for (int r = 0; r < kWorld; ++r) {
      const double compute = 0.10 + 0.01 * ((r + step) % kWorld);
      feed(d, beat(r, step, "compute", 0.13, 0.13 - compute), now);
    }
    ASSERT_FALSE(d.check(now + 0.05).has_value()) << "step " << step;
  }
}

// Every rank's row of the link matrix as a ring sends it (to rank + 1 only), with `slow`
// seconds per MB on the send from `from`, 0.01 elsewhere.
void ring_links(Detector& d, int from, double slow, double now) {
  for (int r = 0; r < kWorld; ++r) {
    json b = beat(r, 10, "compute");
    b["p2p"] = json::array({json::array({(r + 1) % kWorld, r == from ? slow : 0.01})});
    feed(d, b, now);
  }
}

TEST(Detector, LinkAtThreeTimesTheMedianPairIsSlow) {
  Detector d = healthy_run();
  for (int r = 0; r < kWorld; ++r) {
    json b = beat(r, 10, "compute");
    b["p2p"] = json::array();
    for (int p = 0; p < kWorld; ++p)
      if (p != r) b["p2p"].push_back({p, (r == 0 && p == 2) || (r == 2 && p == 0) ? 0.04 : 0.01});
    feed(d, b, 1.05);
  }
  // Slow must last 10 median steps (1 s) before it is a slow link.
  EXPECT_FALSE(d.check(1.1).has_value());
  for (int r = 0; r < kWorld; ++r) feed(d, beat(r, 10, "compute"), 2.05);
  std::optional<Detection> found = d.check(2.15);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm slow");
  EXPECT_EQ(found->culprit, (std::vector<int>{0, 2}));
  EXPECT_DOUBLE_EQ(found->first_sign_at, 1.1);
}

TEST(Detector, RingLinkSlowOneWayIsTheLinkBetweenItsEnds) {
  Detector d = healthy_run();
  ring_links(d, 1, 0.05, 1.05);  // 1 -> 2 costs 5x the others
  EXPECT_FALSE(d.check(1.1).has_value());
  ring_links(d, 1, 0.05, 2.2);
  std::optional<Detection> found = d.check(2.25);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm slow");
  EXPECT_EQ(found->culprit, (std::vector<int>{1, 2}));
}

// What a ring held up by a slow link 1 -> 2 measures: 1's sends and 2's receives wait for
// the link; 0's sends into 1 wait for 1 (late receiver), 3's receives from 2 wait for 2
// (late sender). Only the link that both its ends find slow is.
TEST(Detector, ALateReceiverOrSenderIsNotASlowLink) {
  Detector d = healthy_run();
  for (double now : {1.05, 2.2}) {
    for (int r = 0; r < kWorld; ++r) {
      const double send = r == 0 || r == 1 ? 0.05 : 0.01;  // [peer, send s/MB, recv s/MB]
      const double recv = r == 2 || r == 3 ? 0.05 : 0.01;
      json b = beat(r, 10, "compute");
      b["p2p"] = json::array({json::array({(r + 1) % kWorld, send, -1}),
                              json::array({(r + kWorld - 1) % kWorld, -1, recv})});
      feed(d, b, now);
    }
    if (now < 2) {
      EXPECT_FALSE(d.check(now + 0.05).has_value());
    }
  }
  std::optional<Detection> found = d.check(2.25);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm slow");
  EXPECT_EQ(found->culprit, (std::vector<int>{1, 2}));
}

TEST(Detector, ALinkSlowForLessThanTheHoldIsNotFlagged) {
  Detector d = healthy_run();
  ring_links(d, 3, 0.05, 1.05);  // a receiver descheduled for a moment
  EXPECT_FALSE(d.check(1.1).has_value());
  ring_links(d, 3, 0.02, 1.6);  // back under 3x: the clock starts again
  EXPECT_FALSE(d.check(1.65).has_value());
  ring_links(d, 3, 0.05, 1.9);
  EXPECT_FALSE(d.check(1.95).has_value());
  ring_links(d, 3, 0.05, 2.5);
  EXPECT_FALSE(d.check(2.55).has_value());  // slow since 1.95 only
  ring_links(d, 3, 0.05, 3.0);
  std::optional<Detection> found = d.check(3.0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->culprit, (std::vector<int>{0, 3}));
}

// A stopped rank (SIGSTOP) beats no more, and its neighbours' transfers with it stall: what
// they measure of that pair grows, but it is the hang rules' case (a silent rank), never a
// slow link. Seen in fault_detection's sigstop case as "comm slow [0, 1]" at 1 s, before the
// 2 s hang threshold.
TEST(Detector, AStoppedRanksStalledLinksAreItsHangNotASlowLink) {
  Detector d = healthy_run();
  ring_links(d, -1, 0.01, 1.0);  // every link typical, rank 1 heard last at t = 1
  std::optional<Detection> found;
  for (double t = 1.1; t <= 3.5 && !found; t += 0.1) {
    for (int r : {0, 2, 3}) {  // 0 receives from the stopped 1 ever slower
      json b = beat(r, 10, "compute");
      b["p2p"] = json::array(
          {json::array({(r + 1) % kWorld, 0.01, -1}),
           json::array({(r + kWorld - 1) % kWorld, -1, r == 2 ? 0.01 * (t - 0.9) / 0.1 : 0.01})});
      if (r == 0)
        b["p2p"] =
            json::array({json::array({1, 0.01 * (t - 0.9) / 0.1, -1}), json::array({3, -1, 0.01})});
      feed(d, b, t);
    }
    found = d.check(t);
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "non-comm hang") << found->reason;
  EXPECT_EQ(found->culprit, (std::vector<int>{1}));
}

TEST(Detector, MalformedMessagesAreRefusedNotFatal) {
  Detector d({});
  std::string error;
  EXPECT_EQ(d.message(json::array(), 0, &error), -1);
  EXPECT_EQ(d.message({{"type", "beat"}}, 0, &error), -1);
  EXPECT_EQ(d.message({{"type", "gossip"}, {"rank", 1}}, 0, &error), -1);
  EXPECT_NE(error.find("gossip"), std::string::npos);
}

}  // namespace

// A collective stalled by a rank blocked elsewhere (fault_detection's commhang): transfers
// between the waiting ranks stall with it and read as a slow pair, but the stall is the
// hang rules' case: the slow pair is not reported while the wait is older than any step.
TEST(Detector, PairsStalledByAHangInTheMakingAreNotASlowLink) {
  Detector d = healthy_run();
  std::optional<Detection> found;
  for (double t = 1.05; t <= 3.5 && !found; t += 0.1) {
    for (int r : {0, 2, 3}) {
      json b = waiting(r, 10, "dp", 10, t - 1.0, kEveryone);
      b["p2p"] = json::array({json::array({(r + 1) % kWorld, r == 2 ? 0.05 : 0.01})});
      feed(d, b, t);
    }
    json other = waiting(1, 10, "tp", 5, t - 1.0, {1, 3});
    other["p2p"] = json::array({json::array({2, 0.01})});
    feed(d, other, t);
    found = d.check(t);
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm hang") << found->reason;
  EXPECT_EQ(found->culprit, std::vector<int>{1});
}
