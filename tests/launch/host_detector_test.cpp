// The supervisor's host rules (launch/detector.h) on synthetic beats from 8 ranks on two
// hosts, h0 (ranks 0-3) and h1 (4-7): a host whose ranks fall silent together is unreachable
// (its link cut), one whose connections all close is down, one rank of a host is still that
// rank, and a link between hosts is judged against itself, not against links inside a host.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launch/detector.h"

using nlohmann::json;
using pentad::launch::Detection;
using pentad::launch::Detector;

namespace {

constexpr int kRanks = 8;
const std::vector<int> kHostOne{4, 5, 6, 7};

std::string host_of_rank(int rank) {
  return rank < 4 ? "h0" : "h1";
}

json beat_on_hosts(int rank, int64_t step, const std::string& phase) {
  return {{"type", "beat"},      {"rank", rank},   {"t", 0.0},
          {"step", step},        {"phase", phase}, {"step_seconds", 0.1},
          {"wait_seconds", 0.0}, {"ckpt_step", -1}};
}

void feed_on_hosts(Detector& d, const json& msg, double now) {
  std::string error;
  ASSERT_GE(d.message(msg, now, &error), 0) << error;
}

// Eight ranks on two hosts that said hello and ran steps 1..10 of 0.1 s, t = 0..1.
Detector two_hosts() {
  Detector d({});
  for (int r = 0; r < kRanks; ++r)
    feed_on_hosts(d,
                  {{"type", "hello"},
                   {"rank", r},
                   {"world", kRanks},
                   {"pid", 100 + r},
                   {"host", host_of_rank(r)},
                   {"out_dir", "runs/x"}},
                  0);
  for (int step = 1; step <= 10; ++step)
    for (int r = 0; r < kRanks; ++r)
      feed_on_hosts(d, beat_on_hosts(r, step, "compute"), 0.1 * step);
  return d;
}

TEST(HostRules, AHostWhoseRanksFallSilentTogetherIsUnreachable) {
  Detector d = two_hosts();
  // From t = 1, h1 says nothing (its link is cut); h0's ranks wait for it in dp's all-reduce.
  std::optional<Detection> found;
  for (double t = 1.1; t < 6 && !found; t += 0.1) {
    for (int r = 0; r < 4; ++r) {
      json b = beat_on_hosts(r, 10, "wait");
      b["wait"] = {{"comm", "dp"},
                   {"kind", "all_reduce"},
                   {"seq", 10},
                   {"since_s", t - 1.0},
                   {"members", {0, 2, 4, 6}}};
      feed_on_hosts(d, b, t);
    }
    found = d.check(t);
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "host unreachable") << found->reason;
  EXPECT_EQ(found->culprit, kHostOne);
  EXPECT_EQ(found->host, "h1");
  EXPECT_TRUE(found->host_fault());
  EXPECT_NE(found->reason.find("fell silent together"), std::string::npos) << found->reason;
  EXPECT_LT(found->detected_at, 3.2);  // the hang threshold (2 s) after the wait began
}

TEST(HostRules, AHostWhoseConnectionsAllCloseIsDown) {
  Detector d = two_hosts();
  d.vanished(4, 1.0);
  EXPECT_FALSE(d.check(1.05).has_value());  // the rest of h1 may follow
  for (int r : {5, 6, 7}) d.vanished(r, 1.01);
  std::optional<Detection> found = d.check(1.06);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "host down") << found->reason;
  EXPECT_EQ(found->culprit, kHostOne);
  EXPECT_EQ(found->host, "h1");
}

TEST(HostRules, OneRankGoneOrSilentOnAHostIsThatRank) {
  {
    Detector d = two_hosts();
    d.vanished(5, 1.0);
    EXPECT_FALSE(d.check(1.1).has_value());  // within the host's window
    std::optional<Detection> found = d.check(1.6);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->cls, "dead");
    EXPECT_EQ(found->culprit, std::vector<int>{5});
  }
  {
    Detector d = two_hosts();  // rank 6 stops (SIGSTOP); every other rank beats
    std::optional<Detection> found;
    for (double t = 1.1; t < 6 && !found; t += 0.1) {
      for (int r = 0; r < kRanks; ++r)
        if (r != 6) feed_on_hosts(d, beat_on_hosts(r, 10, "compute"), t);
      found = d.check(t);
    }
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->cls, "non-comm hang") << found->reason;
    EXPECT_EQ(found->culprit, std::vector<int>{6});
  }
}

// A ring over all 8 ranks (r sends to r + 1): pairs 3-4 and 0-7 cross between the hosts and
// cost `between` s/MB, the six inside a host 0.01.
void ring_on_hosts(Detector& d, double between, double now) {
  for (int r = 0; r < kRanks; ++r) {
    json b = beat_on_hosts(r, 10, "compute");
    const bool crosses = r == 3 || r == 7;
    b["p2p"] = json::array({json::array({(r + 1) % kRanks, crosses ? between : 0.01})});
    feed_on_hosts(d, b, now);
  }
}

TEST(HostRules, ALinkBetweenHostsIsJudgedAgainstItselfNotTheLinksInsideAHost) {
  Detector d = two_hosts();
  // Between the hosts 5x a link inside one, as TCP over a wire is beside shared memory: no
  // fault, however long it lasts.
  double t = 1.0;
  for (; t < 5; t += 0.1) {
    ring_on_hosts(d, 0.05, t);
    ASSERT_FALSE(d.check(t).has_value()) << "t = " << t;
  }
  // The host link throttled to a tenth: both pairs across it, 10x what they were.
  std::optional<Detection> found;
  const double throttled = t;
  for (; t < 10 && !found; t += 0.1) {
    ring_on_hosts(d, 0.5, t);
    found = d.check(t);
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->cls, "comm slow") << found->reason;
  EXPECT_EQ(found->culprit, (std::vector<int>{0, 7}));
  EXPECT_EQ(found->host, "h0");
  EXPECT_EQ(found->peer_host, "h1");
  EXPECT_NE(found->reason.find("10.0x its own first"), std::string::npos) << found->reason;
  EXPECT_LT(found->detected_at - throttled, 1.5);
}

}  // namespace
