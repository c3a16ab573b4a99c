// The pipeline schedules as data: every pass exactly once and in a feasible order, the
// memory each schedule promises, and the bubbles of the papers under ideal costs.
#include "parallel/pp/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/check.h"

namespace pentad::parallel::pp {
namespace {

std::vector<ScheduleSpec> all_specs() {
  std::vector<ScheduleSpec> specs;
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 6, 8, 16}) {
      specs.push_back({ScheduleKind::GPipe, p, m, 1, 1});
      specs.push_back({ScheduleKind::OneFOneB, p, m, 1, 1});
      for (int k = 1; k <= m; ++k) specs.push_back({ScheduleKind::KFKB, p, m, 1, k});
      if (p >= 2 && m % p == 0)
        for (int v : {1, 2, 3, 4}) specs.push_back({ScheduleKind::Interleaved, p, m, v, 1});
    }
  return specs;
}

std::string label(const ScheduleSpec& s) {
  return fmt::format("{} p{} m{} v{} k{}", schedule_name(s.kind), s.stages, s.micro_batches,
                     s.virtual_stages, s.group);
}

TEST(Schedule, EveryPassOnceForwardBeforeBackward) {
  for (const ScheduleSpec& spec : all_specs())
    for (int s = 0; s < spec.stages; ++s) {
      const std::vector<Action> actions = stage_actions(spec, s);
      ASSERT_EQ(actions.size(), size_t(2 * spec.micro_batches * spec.virtual_stages))
          << label(spec);
      std::set<std::pair<int, int>> forwarded, backwarded;
      for (const Action& a : actions) {
        ASSERT_TRUE(a.micro >= 0 && a.micro < spec.micro_batches && a.chunk >= 0 &&
                    a.chunk < spec.virtual_stages)
            << label(spec);
        if (a.type == Action::Forward) {
          EXPECT_TRUE(forwarded.insert({a.micro, a.chunk}).second) << label(spec);
        } else {
          EXPECT_TRUE(forwarded.count({a.micro, a.chunk})) << label(spec) << " backward first";
          EXPECT_TRUE(backwarded.insert({a.micro, a.chunk}).second) << label(spec);
        }
      }
    }
}

TEST(Schedule, NoScheduleDeadlocks) {
  for (const ScheduleSpec& spec : all_specs()) {
    SimCosts costs;
    costs.forward_seconds.assign(size_t(spec.stages), 1.0);
    costs.backward_seconds.assign(size_t(spec.stages), 2.0);
    costs.transfer_seconds = 0.25;
    EXPECT_FALSE(simulate(spec, costs).deadlock) << label(spec);
  }
}

TEST(Schedule, MemoryInFlight) {
  for (int p : {2, 4, 8})
    for (int m : {1, 4, 8, 16})
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(peak_in_flight(stage_actions({ScheduleKind::GPipe, p, m, 1, 1}, s)), m);
        EXPECT_EQ(peak_in_flight(stage_actions({ScheduleKind::OneFOneB, p, m, 1, 1}, s)),
                  std::min(p - s, m));
        for (int k : {1, 2, 4})
          if (k <= m) {
            EXPECT_EQ(peak_in_flight(stage_actions({ScheduleKind::KFKB, p, m, 1, k}, s)),
                      std::min(m, k * (p - s)))
                << "p" << p << " m" << m << " k" << k << " stage " << s;
          }
      }
  // Interleaved (Megatron): (p - s - 1) * 2 + (v - 1) * p warm-up chunk passes, plus one.
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int s = 0; s < p; ++s) {
        const int m = 2 * p;
        EXPECT_EQ(peak_in_flight(stage_actions({ScheduleKind::Interleaved, p, m, v, 1}, s)),
                  std::min(m * v, (p - s - 1) * 2 + (v - 1) * p + 1));
      }
}

TEST(Schedule, IdealBubbles) {
  for (int p : {2, 4, 8})
    for (int m : {4, 8, 16, 32}) {
      SimCosts costs;
      costs.forward_seconds.assign(size_t(p), 1.0);
      costs.backward_seconds.assign(size_t(p), 2.0);
      const double want = double(p - 1) / double(m + p - 1);
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        const SimResult r = simulate({kind, p, m, 1, 1}, costs);
        EXPECT_NEAR(r.bubble_fraction(), want, 1e-12)
            << schedule_name(kind) << " p" << p << " m" << m;
        EXPECT_NEAR(r.step_seconds, 3.0 * (m + p - 1), 1e-9);
      }
      if (m % p == 0)
        for (int v : {2, 4}) {
          const SimResult r = simulate({ScheduleKind::Interleaved, p, m, v, 1}, costs);
          EXPECT_NEAR(r.bubble_fraction(), double(p - 1) / double(v * m + p - 1), 1e-12)
              << "interleaved p" << p << " m" << m << " v" << v;
        }
    }
}

// Per-link transfer times: all equal is the single time; one slow link (stage 1 to 2, as
// between two nodes of two stages each) lengthens the step by at least its delay on the fill
// and the drain, and by less than every micro-batch paying it both ways.
TEST(Schedule, LinkTimesPerDirectedLink) {
  SimCosts costs;
  costs.forward_seconds = {1.0, 1.0, 1.0, 1.0};
  costs.backward_seconds = {2.0, 2.0, 2.0, 2.0};
  costs.transfer_seconds = 0.25;
  const ScheduleSpec spec{ScheduleKind::OneFOneB, 4, 8, 1, 1};
  const double uniform = simulate(spec, costs).step_seconds;
  costs.link_seconds.assign(16, 0.25);
  EXPECT_DOUBLE_EQ(simulate(spec, costs).step_seconds, uniform);
  costs.link_seconds[1 * 4 + 2] = costs.link_seconds[2 * 4 + 1] = 2.25;
  const double slow = simulate(spec, costs).step_seconds;
  EXPECT_GE(slow, uniform + 2 * 2.0 - 1e-9);
  EXPECT_LT(slow, uniform + 8 * 2 * 2.0);
}

TEST(Schedule, SharedCoresReplay) {
  SimCosts costs;
  costs.forward_seconds = {1.0, 1.0, 1.0, 1.0};
  costs.backward_seconds = {2.0, 2.0, 2.0, 2.0};
  costs.transfer_seconds = 0.25;
  // Cores enough for every stage's ranks at once: the shared replay is the ordinary one.
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    const SimResult own = simulate({kind, 4, 8, 1, 1}, costs);
    costs.core_share = 4.0;
    costs.stages_per_node = 4;
    const SimResult shared = simulate({kind, 4, 8, 1, 1}, costs);
    costs.core_share = 0.0;
    EXPECT_NEAR(shared.step_seconds, own.step_seconds, 1e-9) << schedule_name(kind);
  }
  // One stage on a quarter of a core: four times its work.
  SimCosts one;
  one.forward_seconds = {1.0};
  one.backward_seconds = {2.0};
  one.core_share = 0.25;
  EXPECT_NEAR(simulate({ScheduleKind::OneFOneB, 1, 8, 1, 1}, one).step_seconds, 4 * 8 * 3.0, 1e-9);
  // Two stages sharing one core (half a core for each rank set when both run), the last
  // three times the first's work: the idle first stage hands the core to the last, so the
  // step is near the total work (8 x (3 + 9) = 96 at full speed), far below the own-core
  // replay stretched by two (the last stage's 8 x 9, plus the fill, times two).
  SimCosts uneven;
  uneven.forward_seconds = {1.0, 3.0};
  uneven.backward_seconds = {2.0, 6.0};
  const double own = simulate({ScheduleKind::OneFOneB, 2, 8, 1, 1}, uneven).step_seconds;
  uneven.core_share = 1.0;
  uneven.stages_per_node = 2;
  const SimResult shared = simulate({ScheduleKind::OneFOneB, 2, 8, 1, 1}, uneven);
  EXPECT_FALSE(shared.deadlock);
  EXPECT_GE(shared.step_seconds, 96.0 - 1e-9);
  EXPECT_LT(shared.step_seconds, 1.1 * 96.0);
  EXPECT_GT(2 * own, 1.4 * shared.step_seconds);
  // Stages on nodes of their own share nothing: the own-core replay at half speed.
  uneven.stages_per_node = 1;
  uneven.core_share = 0.5;
  EXPECT_NEAR(simulate({ScheduleKind::OneFOneB, 2, 8, 1, 1}, uneven).step_seconds, 2 * own, 1e-9);
}

TEST(Schedule, GroupingHidesLatency) {
  // A slow link: 1F1B pays the latency on its critical path every micro-batch; kFkB with
  // k = 4 pays it once per group and finishes sooner, for the same compute.
  SimCosts costs;
  costs.forward_seconds = {1.0, 1.0};
  costs.backward_seconds = {2.0, 2.0};
  costs.transfer_seconds = 2.0;
  const double one = simulate({ScheduleKind::OneFOneB, 2, 16, 1, 1}, costs).step_seconds;
  const double four = simulate({ScheduleKind::KFKB, 2, 16, 1, 4}, costs).step_seconds;
  EXPECT_LT(four, 0.9 * one) << "1f1b " << one << " s, 4f4b " << four << " s";
}

TEST(Schedule, AdaptiveChoiceFollowsTheLinkWithinTheMemoryLimit) {
  SimCosts costs;
  costs.forward_seconds = {1.0, 1.0};
  costs.backward_seconds = {2.0, 2.0};
  const ScheduleSpec spec{ScheduleKind::KFKB, 2, 16, 1, 1};
  const std::vector<double> slot_bytes = {100.0, 100.0};
  const double unlimited = std::numeric_limits<double>::infinity();
  costs.transfer_seconds = 0.0;  // a free link: grouping only lengthens the fill
  EXPECT_EQ(choose_group(spec, costs, slot_bytes, unlimited).group, 1);
  costs.transfer_seconds = 2.0;  // a slow link: grouping hides it
  const GroupChoice slow = choose_group(spec, costs, slot_bytes, unlimited);
  EXPECT_GT(slow.group, 1);
  EXPECT_LT(slow.step_seconds, slow.one_f_one_b_seconds);
  // Stage 0 holds k * p micro-batches of 100 bytes: a 250-byte limit allows k = 1 only.
  EXPECT_EQ(choose_group(spec, costs, slot_bytes, 250.0).group, 1);
}

TEST(Schedule, RefusalsNameTheKey) {
  auto message = [](const ScheduleSpec& spec) {
    try {
      check_schedule(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({ScheduleKind::Interleaved, 2, 3, 2, 1})
                .find("train.grad_accum = 3 is not a multiple of 2"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::OneFOneB, 2, 4, 2, 1}).find("parallel.pp_schedule"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::KFKB, 2, 4, 1, 5}).find("parallel.pp_group = 5"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::Interleaved, 1, 4, 2, 1}).find("parallel.pp >= 2"),
            std::string::npos);
  EXPECT_THROW(parse_schedule("zb"), Error);
}

}  // namespace
}  // namespace pentad::parallel::pp
