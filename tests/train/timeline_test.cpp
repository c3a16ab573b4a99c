// The pipeline timeline's measurement (src/train/timeline.h) on traces made here: each stage
// runs its list of the schedule in order, every pass as long as the test says, with a fixed
// executor gap after each pass and a fixed transfer from a pass's end to its input's arrival
// at the next stage, a stage waiting (a wait span) where the input is not there yet. What
// the trace is made from is known, so the measured bubble, the executor gap and the transfer
// are known, and so is what each replay must give.
#include "train/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "parallel/pp/pipeline.h"

namespace pentad {
namespace {

namespace pp = parallel::pp;

struct Trace {
  timeline::Rows rows;
  double bubble = 0;  // 1 - mean busy / window over the steps after the first
};

// `steps` steps of the spec's lists on p ranks (one a stage), each pass `pass(stage, action,
// step)` seconds, `gap` seconds of executor time after each, `transfer` seconds from a
// pass's end to its output's arrival. Times in ns from 0; a step starts when the last ends.
Trace make_trace(const pp::ScheduleSpec& spec, int steps,
                 const std::function<double(int, const pp::Action&, int)>& pass, double gap,
                 double transfer) {
  const int p = spec.stages;
  const pp::ChunkPlacement place = spec.placement();
  const std::vector<std::vector<pp::Action>> lists = pp::schedule_actions(spec);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(p));
  auto ns = [](double s) { return int64_t(s * 1e9 + 0.5); };
  double origin = 0, bubble_sum = 0;
  for (int step = 0; step < steps; ++step) {
    // (type carried, micro, virtual stage): when that input is there
    std::map<std::tuple<int, int, int>, double> arrival;
    std::vector<size_t> next(size_t(p), 0);
    std::vector<double> free(size_t(p), origin), busy(size_t(p), 0.0);
    for (int s = 0; s < p; ++s)
      rows[size_t(s)].insert(rows[size_t(s)].end(), {-1, 0, 0, step, ns(origin), ns(origin), 0});
    double end = origin;
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < p; ++s) {
        if (next[size_t(s)] == lists[size_t(s)].size()) continue;
        const pp::Action& a = lists[size_t(s)][next[size_t(s)]];
        const int vs = place.virtual_stage(s, a.chunk);
        const bool forward = a.type == pp::Action::Forward;
        const bool needs =
            a.type != pp::Action::Weight && (forward ? vs > 0 : vs < place.virtual_stages() - 1);
        double ready = free[size_t(s)];
        if (needs) {
          const auto it = arrival.find({forward ? 0 : 1, a.micro, vs});
          if (it == arrival.end()) continue;  // not sent yet: another stage first
          if (it->second > ready) {
            const auto wait = forward ? pp::Span::WaitInput : pp::Span::WaitGrad;
            rows[size_t(s)].insert(rows[size_t(s)].end(), {int64_t(wait), a.micro, a.chunk, step,
                                                           ns(ready), ns(it->second), 0});
            ready = it->second;
          }
        }
        const double seconds = pass(s, a, step);
        const auto kind = forward                        ? pp::Span::Forward
                          : a.type == pp::Action::Input  ? pp::Span::BackwardInput
                          : a.type == pp::Action::Weight ? pp::Span::BackwardWeight
                                                         : pp::Span::Backward;
        rows[size_t(s)].insert(
            rows[size_t(s)].end(),
            {int64_t(kind), a.micro, a.chunk, step, ns(ready), ns(ready + seconds), ns(seconds)});
        busy[size_t(s)] += seconds;
        end = std::max(end, ready + seconds);
        const int to = forward ? vs + 1 : vs - 1;
        if (a.type != pp::Action::Weight && to >= 0 && to < place.virtual_stages())
          arrival[{forward ? 0 : 1, a.micro, to}] = ready + seconds + transfer;
        free[size_t(s)] = ready + seconds + gap;
        ++next[size_t(s)];
        moved = true;
      }
    }
    for (int s = 0; s < p; ++s)
      EXPECT_EQ(next[size_t(s)], lists[size_t(s)].size()) << "stage " << s << " deadlocked";
    if (step > 0) {
      double all = 0;
      for (double b : busy) all += b;
      bubble_sum += 1.0 - all / double(p) / (end - origin);
    }
    origin = *std::max_element(free.begin(), free.end());
  }
  Trace t;
  for (const std::vector<int64_t>& r : rows) {
    t.rows.counts.push_back(int64_t(r.size()));
    t.rows.values.insert(t.rows.values.end(), r.begin(), r.end());
  }
  t.rows.total = int64_t(t.rows.values.size());
  t.bubble = bubble_sum / double(steps - 1);
  return t;
}

parallel::MeshConfig pipeline_mesh(const pp::ScheduleSpec& spec) {
  parallel::MeshConfig mesh;
  mesh.pp = spec.stages;
  mesh.pp_vee = spec.kind == pp::ScheduleKind::ZBV;
  return mesh;
}

NodeShare own_cores(int ranks) {
  NodeShare node;
  node.ranks = node.threads = node.cores = ranks;
  return node;
}

// Every pass as long as its kind says, the executor free: the transfers are the only thing
// the lists' replay leaves out, and the replay with them is the trace.
TEST(Timeline, ReplaysWithTheMeasuredTransfersAreTheTrace) {
  pp::ScheduleSpec spec;
  spec.stages = 2;
  spec.micro_batches = 4;
  auto pass = [](int, const pp::Action& a, int) {
    return a.type == pp::Action::Forward ? 1e-3 : 2e-3;
  };
  const Trace t = make_trace(spec, 3, pass, 0.0, 3e-4);
  const timeline::Bubbles b =
      timeline::measure(t.rows, pipeline_mesh(spec), spec, 0, own_cores(2)).bubbles;
  EXPECT_EQ(b.steps, 2);
  EXPECT_NEAR(b.wall, t.bubble, 1e-9);
  EXPECT_NEAR(b.transfer_ms, 0.3, 1e-6);
  EXPECT_NEAR(b.gap_ms, 0.0, 1e-9);
  EXPECT_NEAR(b.replayed, 0.2, 1e-9);  // (p - 1) / (m + p - 1): free transfers
  EXPECT_NEAR(b.timed, 0.2, 1e-9);
  EXPECT_NEAR(b.compute, 0.2, 1e-9);
  EXPECT_GT(b.wall, 0.2 + 0.01);
  EXPECT_NEAR(b.gaps, t.bubble, 1e-9);
  EXPECT_NEAR(b.sampled, t.bubble, 1e-9);  // no spread to draw from
}

pp::ScheduleSpec zero_bubble_h1() {
  pp::ScheduleSpec spec;
  spec.kind = pp::ScheduleKind::ZBH1;
  spec.stages = 2;
  spec.micro_batches = 6;
  return spec;
}

// ZB-H1 with an executor gap after each pass: the gap is measured (the last pass of a step
// has none after it in the window), and so is the transfer, from the pass's end; the replay
// that adds the gap to each pass and takes it off the transfer is within 0.5% of the trace
// (its step ends with the last pass's gap), and with nothing to draw from, the sampled
// replay is that one.
TEST(Timeline, TheExecutorGapAndTheTransferAreMeasured) {
  const pp::ScheduleSpec spec = zero_bubble_h1();
  auto pass = [](int, const pp::Action&, int) { return 1e-3; };
  const double gap = 1e-4;
  const Trace t = make_trace(spec, 4, pass, gap, 4e-4);
  const timeline::Bubbles b =
      timeline::measure(t.rows, pipeline_mesh(spec), spec, 0, own_cores(2)).bubbles;
  EXPECT_EQ(b.steps, 3);
  EXPECT_NEAR(b.wall, t.bubble, 1e-9);
  const double passes = 3.0 * spec.micro_batches;  // a stage's in a step
  EXPECT_NEAR(b.gap_ms, gap * 1e3 * (passes - 1) / passes, 1e-6);
  EXPECT_NEAR(b.transfer_ms, 0.4, 1e-6);
  EXPECT_NEAR(b.gaps, t.bubble, 0.005 * t.bubble);
  EXPECT_NEAR(b.sampled, b.gaps, 1e-9);
}

// ZB-H1 whose stage 0 runs odd micro-batches' forwards 60% longer, on a free executor and
// free links: the replay of each pass as timed is the trace; the replay at the means is
// not; drawing each pass from its kind's measured spread lengthens the step on average
// (a step's length is its longest path, a maximum of sums, convex in the passes' times).
TEST(Timeline, PassesAsTimedReplayTheTraceAndTheSpreadIsDrawn) {
  const pp::ScheduleSpec spec = zero_bubble_h1();
  auto pass = [](int s, const pp::Action& a, int) {
    return s == 0 && a.type == pp::Action::Forward && a.micro % 2 ? 1.6e-3 : 1e-3;
  };
  const Trace t = make_trace(spec, 4, pass, 0.0, 0.0);
  const timeline::Bubbles b =
      timeline::measure(t.rows, pipeline_mesh(spec), spec, 0, own_cores(2)).bubbles;
  EXPECT_NEAR(b.wall, t.bubble, 1e-9);
  EXPECT_NEAR(b.timed, t.bubble, 1e-9);
  EXPECT_GT(std::abs(b.replayed - t.bubble), 0.005);
  EXPECT_GT(b.sampled, b.gaps);
}

}  // namespace
}  // namespace pentad
