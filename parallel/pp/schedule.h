#pragma once
// Pipeline schedules as data: for every stage, the ordered list of forward and backward
// passes it runs in one optimizer step. Nothing here communicates; the executor
// (parallel/pp/pipeline.h) derives every transfer from these lists, and the simulator below
// replays them to check them (no deadlock, peak memory) and to predict step times.
//
// Names follow the papers: p stages, m micro-batches, v virtual stages (model chunks) per
// stage, k micro-batches per group (Ada-Grouper's kFkB). Virtual stage j of stage s holds
// model chunk j * p + s (Megatron's interleaving), so activations visit stages 0..p-1, then
// 0..p-1 again, v times; ZB-V places its two chunks in a V instead (parallel/pp/layout.h).
//   GPipe:       every forward, then every backward; m micro-batches in flight.
//   1F1B:        p - s - 1 warm-up forwards, then one forward / one backward; at most p - s.
//   kFkB:        1F1B over groups of k micro-batches (k forwards, then k backwards); k = 1
//                is 1F1B and k = m is GPipe. Grouping pays a link's latency once per k.
//   interleaved: 1F1B over v chunks per stage (Megatron-Core); the bubble shrinks by v.
//   zb-h1, zb-v: the zero-bubble schedules (Qi et al., arXiv 2401.10241 and 2405.15362).
//                Each backward is split into B, the input gradient the stage below waits
//                for, and W, the weight gradient, which waits to fill what would be bubble.
//                ZB-H1 keeps 1F1B's order of forwards and Bs and holds at most p micro-
//                batches on any stage (1F1B's stage 0), fewer where a stage's are larger
//                (ScheduleSpec::zb_held_limits): bubble about (p-1) / (3m + p-1) with
//                F = B = W. ZB-V runs two chunks per stage placed in a V, so the first stage
//                also holds the loss, and holds at most 2p chunk passes (1F1B's peak): its
//                bubble nears zero. A micro-batch's activations stay until its W.
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pp/layout.h"

namespace pentad::parallel::pp {

enum class ScheduleKind { GPipe, OneFOneB, KFKB, Interleaved, ZBH1, ZBV };
const char* schedule_name(ScheduleKind kind);
// "gpipe", "1f1b", "kfkb", "interleaved", "zb-h1", "zb-v"; anything else throws
// pentad::Error listing them.
ScheduleKind parse_schedule(const std::string& name);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;          // p
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v (interleaved only; 1 otherwise)
  int group = 1;           // k (kFkB only)
  // Zero-bubble only: the costs its lists are built for, per stage one chunk's forward, B
  // and W (3 * stages values, any unit), or per stage and chunk (3 * stages * v, stage s's
  // chunk c at 3 * (s * v + c)), then one transfer; empty: F = B = W and free transfers (the
  // papers' unit costs). The trainer sets them from measured passes, per chunk: zb-v's first
  // stage runs both the embedding's chunk and the head's.
  std::vector<double> zb_costs = {};
  // ZB-H1 only: per stage, the most micro-batches held from forward to W, at least 1F1B's
  // p - s (its order of forwards and Bs needs them); empty: p on every stage. Set where the
  // stages' activations differ in size (zero_bubble_held_limits), so no stage holds more
  // bytes than 1F1B's fullest one.
  std::vector<int> zb_held_limits = {};
  // Whether backward runs as B and W (the zero-bubble schedules); where chunks sit.
  bool splits_backward() const { return kind == ScheduleKind::ZBH1 || kind == ScheduleKind::ZBV; }
  ChunkPlacement placement() const { return {stages, virtual_stages, kind == ScheduleKind::ZBV}; }
};

// Throws pentad::Error naming the key to change when the schedule cannot run: more than 63
// virtual stages (p * v), v > 1 for a schedule other than interleaved and zb-v, zb-v with v
// other than 2, interleaved with m not a multiple of p, k outside [1, m].
void check_schedule(const ScheduleSpec& spec);

struct Action {
  // Backward: the whole backward pass; Input and Weight: its two halves, B and W.
  enum Type : uint8_t { Forward, Backward, Input, Weight };
  Type type = Forward;
  int micro = 0;  // micro-batch
  int chunk = 0;  // virtual stage on this stage (0..v-1); model chunk = chunk * p + stage
  bool operator==(const Action&) const = default;
};

// What crosses stages after a pass: a forward's activation, a backward's (or B's) gradient;
// W sends nothing. As Backward for B.
inline Action::Type carried(Action::Type type) {
  return type == Action::Input ? Action::Backward : type;
}

// Stage s's passes in order: each (micro, chunk) forward once and backward once (B then W
// where the schedule splits it), the backward after the forward: 2 * m * v actions, 3 * m * v
// split.
std::vector<Action> stage_actions(const ScheduleSpec& spec, int stage);
// Every stage's, at once (the zero-bubble lists are built for all stages together).
std::vector<std::vector<Action>> schedule_actions(const ScheduleSpec& spec);
// The zero-bubble schedules' lists, every stage's (parallel/pp/zero_bubble.cpp).
std::vector<std::vector<Action>> zero_bubble_lists(const ScheduleSpec& spec);
std::vector<Action> zero_bubble_stage_list(const ScheduleSpec& spec, int stage);  // one stage's
// ZB-H1's limits (ScheduleSpec::zb_held_limits) for stages whose slots, one micro-batch's
// activations, take slot_bytes[s], beside fixed_bytes[s] whatever the micro-batches (empty:
// none): stage s holds at most what 1F1B's fullest stage does, max over s of
// fixed_bytes[s] + (p - s) x slot_bytes[s], and at most p micro-batches. With equal slots (or
// smaller ones further down) and no fixed bytes that is p everywhere, and the answer is
// empty.
std::vector<int> zero_bubble_held_limits(const std::vector<double>& slot_bytes,
                                         const std::vector<double>& fixed_bytes = {});

// Micro-batch activations alive at once on a stage running `actions` (a forward acquires
// one set, its backward, or its W, frees it): the peak over the step; of one chunk's
// actions only where `chunk` >= 0 (the slots that chunk makes).
int peak_in_flight(const std::vector<Action>& actions, int chunk = -1);

// Discrete-event replay of a whole schedule: every stage runs its list in order; a pass
// starts when its input has arrived (forward: the previous virtual stage's output; backward:
// the next one's gradient) and the stage is free. A transfer takes `latency + bytes/bandwidth`
// and the messages on one directed link go one at a time. Sends never block the sender.
//
// Shared cores (`core_share` > 0: ranks outnumbering a CPU node's cores): the stages of a
// node, `stages_per_node` consecutive ones, share its cores, and a stage waiting for input
// yields them. A running stage computes at min(1, core_share / running stages of its node),
// core_share being the node's cores over one stage's ranks on it; the costs are at full
// speed. Each pass then advances by processor sharing instead of at a fixed rate.
// The pass costs are per stage (p values), or per stage and chunk (p * v values, stage s's
// chunk c at s * v + c) where a stage's chunks differ.
struct SimCosts {
  std::vector<double> forward_seconds;   // one micro-batch through one chunk
  std::vector<double> backward_seconds;  // B and W together
  // W's share of backward_seconds (split schedules); empty: half of it (B and W each run one
  // GEMM per weight).
  std::vector<double> weight_seconds;
  double transfer_seconds = 0.0;  // one activation (or gradient) over one link
  // Per directed link (from stage * stages + to stage); empty: transfer_seconds on every link.
  std::vector<double> link_seconds;
  // Per stage, each pass of its list in order, timed (a traced step's); where given, these
  // and not the costs above.
  std::vector<std::vector<double>> timed_seconds;
  double core_share = 0.0;  // 0: every rank has its own device or core
  int stages_per_node = 1;
};
struct SimResult {
  bool deadlock = false;             // some stage waited on a pass that never runs
  double step_seconds = 0.0;         // last pass's end
  std::vector<double> busy_seconds;  // per stage (shared cores: its passes' wall time)
  std::vector<int> peak_in_flight;   // per stage
  double bubble_fraction() const;    // 1 - mean busy / step
};
SimResult simulate(const ScheduleSpec& spec, const SimCosts& costs);
// The costs a zero-bubble spec's lists are built for (its zb_costs, or unit costs), as the
// simulator takes them.
SimCosts zero_bubble_sim_costs(const ScheduleSpec& spec);
// The same replay of given lists (lists[s]: stage s's), e.g. candidates for a schedule.
SimResult simulate_lists(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                         const SimCosts& costs);

// Adaptive kFkB's choice: the group size k in [1, m] whose simulated step is the shortest
// among those whose peak activations (peak micro-batches in flight x slot_bytes[stage])
// fit in limit_bytes on every stage; k = 1 when none fits. spec.kind is taken as kFkB.
struct GroupChoice {
  int group = 1;
  double step_seconds = 0.0;         // predicted, for the chosen k
  double one_f_one_b_seconds = 0.0;  // predicted for k = 1
};
GroupChoice choose_group(ScheduleSpec spec, const SimCosts& costs,
                         const std::vector<double>& slot_bytes, double limit_bytes);

// The bubble of an ideal pipeline (equal stages, free transfers, backward = 2 x forward,
// B = W): (p-1) / (v*m + p-1) for GPipe, 1F1B and interleaved; kFkB and the zero-bubble
// schedules are simulated under the same costs, the latter with their lists built for them
// whatever spec.zb_costs says (ZB-H1's is (p-1) / (3m + p-1) there).
double ideal_bubble_fraction(const ScheduleSpec& spec);

}  // namespace pentad::parallel::pp
