#pragma once
// The pipeline timeline's measurement (src/train/timeline.cpp), apart from the trainer that
// gathers it: every rank's spans as rows, the Chrome-trace events they make, and the bubble
// measured from them and predicted by replaying the schedule several ways (Bubbles).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "parallel/mesh.h"
#include "parallel/pp/schedule.h"
#include "plan/memory_budget.h"

namespace pentad::timeline {

// A span as a row of 7 int64: kind (parallel::pp::Span::Kind), micro-batch, chunk, step,
// start ns, end ns, CPU ns; a step's start is a row of kind -1 (start = end, CPU 0).
constexpr int64_t kRow = 7;

// Every rank's rows, rank after rank: counts[r] values of rank r's (kRow a span), total in
// all.
struct Rows {
  std::vector<int64_t> values, counts;
  int64_t total = 0;
};

// The bubble, 1 - mean busy / step window, measured and replayed (the steps counted: those
// after the first traced, and of them the ones run with the lists set at lists_since).
struct Bubbles {
  double wall = 0, cpu = 0;  // measured by the clock, and by CPU time
  double compute = 0;        // the schedule replayed with each pass's mean CPU time
  double replayed = 0;       // ... with each pass's mean wall time
  double gaps = 0;           // ... with each stage's mean executor time between spans after
                             // a pass, and each transfer's measured median less the
                             // sender's gap (measured from the pass's end, it holds it)
  double gap_ms = 0;         // that time, the stages' mean
  double transfer_ms = 0;
  double sampled = 0;  // ... with each pass drawn from its kind's measured passes (-1: none)
  double timed = 0;    // ... with each pass as timed, step by step (-1: not replayable)
  int steps = 0;
};

struct Measurement {
  nlohmann::json events = nlohmann::json::array();  // Chrome-trace events, one track a rank
  Bubbles bubbles;
};

// `node`: the ranks' share of this machine (wall-time bubbles count waits for a core where
// threads outnumber cores). The lists replayed are pp::schedule_actions(spec).
Measurement measure(const Rows& rows, const parallel::MeshConfig& mesh,
                    const parallel::pp::ScheduleSpec& spec, int64_t lists_since,
                    const NodeShare& node);

}  // namespace pentad::timeline
