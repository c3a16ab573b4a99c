// The zero-bubble schedules' lists (parallel/pp/schedule.h): built by replaying every stage
// at the costs given (ScheduleSpec::zb_costs; by default F = B = W and free transfers, the
// papers' unit costs), each stage choosing its next pass when the last one ends:
//   ZB-H1: 1F1B's order of forwards and Bs. A W runs when the next of those has no input
//          yet (what 1F1B would spend waiting) or when the next forward would hold more
//          micro-batches than the stage's limit (p, 1F1B's peak on stage 0; fewer where a
//          stage's slots are larger, ScheduleSpec::zb_held_limits); the Ws left run at the end.
//   ZB-V:  among what is ready, by one of two priorities: a B before a forward (the B-first
//          list) or a forward before a B (forward-first), then a W. A B takes the oldest
//          micro-batch (on a tie the chunk deeper in the model, whose gradient has further
//          to go), a forward the deeper chunk first (finishing micro-batches early), and at
//          most 2p chunk passes are held between forward and W (1F1B's peak in half-stage
//          chunks); over that only the deepest chunk's forward, when nothing else can run.
//          With the reserve, the last of the 2p places is the deepest chunk's alone.
// Of the lists built at these costs, at their stage means (costs per chunk) and at unit
// costs (each priority for ZB-V, and each with the reserve where these costs are measured
// ones), those that hold no more slots on any stage and chunk than the unit-cost lists (the
// memory plan's), and of those the one whose replay at these costs ends first.
// With F = B = W, ZB-H1 meets its formula and ZB-V the least a V can idle (the last stage's
// fill); with uneven costs (a B slower than a forward, a W faster) lists built for the
// measured costs idle far less than the unit ones (bench/zero_bubble_bench.py).
// The lists keep the order of one feasible run, so they run without deadlock whatever the
// real costs: a pass only ever waits for passes that come before it in that run. Each
// chunk's Ws run in micro-batch order (oldest first) in every list, so a parameter's
// gradient sums its micro-batches in one order whatever the costs the lists were built for.
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <tuple>

#include "core/check.h"
#include "parallel/pp/schedule.h"

namespace pentad::parallel::pp {

namespace {

constexpr double kNotYet = std::numeric_limits<double>::infinity();

// One stage's state during the replay.
struct ZbStage {
  std::vector<Action> order;      // ZB-H1: 1F1B's forwards and Bs, in order
  size_t next = 0;                // ZB-H1: into order
  std::vector<int> next_forward;  // ZB-V: per chunk, the next micro-batch to forward
  std::vector<int> next_input;    // ZB-V: per chunk, the next micro-batch's B
  std::deque<Action> weights;     // Bs whose W has not run, oldest first
  int held = 0;                   // micro-batches (chunk passes) between forward and W
  double free_at = 0;             // when its last pass ends
  std::vector<Action> out;
};

class ZbReplay {
 public:
  ZbReplay(const ScheduleSpec& spec, bool forward_first, bool reserve)
      : spec_(spec),
        place_(spec.placement()),
        last_vs_(place_.virtual_stages() - 1),
        forward_first_(forward_first),
        reserve_(reserve),
        arrive_(size_t(2) * size_t(spec.micro_batches) * size_t(place_.virtual_stages()), kNotYet) {
    const size_t p = size_t(spec.stages);
    const size_t v = size_t(spec.virtual_stages);
    PENTAD_CHECK(spec.zb_costs.empty() || spec.zb_costs.size() == 3 * p + 1 ||
                     spec.zb_costs.size() == 3 * p * v + 1,
                 "zero-bubble costs: {} values for {} stages of {} chunks (3 per stage, or per "
                 "stage and chunk, and a transfer)",
                 spec.zb_costs.size(), p, v);
    chunks_ = spec.zb_costs.size() == 3 * p * v + 1 ? int(v) : 1;
    const std::vector<int>& limits = spec.zb_held_limits;
    PENTAD_CHECK(limits.empty() || (spec.kind == ScheduleKind::ZBH1 && limits.size() == p),
                 "{}: {} held limits for {} stages", schedule_name(spec.kind), limits.size(), p);
    for (int s = 0; s < int(limits.size()); ++s)  // below p - s 1F1B's order cannot run
      PENTAD_CHECK(limits[size_t(s)] >= spec.stages - s,
                   "zb-h1: stage {} may hold {} micro-batches, 1F1B's order needs {}", s,
                   limits[size_t(s)], spec.stages - s);
    costs_ = spec.zb_costs;
    if (costs_.empty()) {
      costs_.assign(3 * p + 1, 1.0);
      costs_.back() = 0.0;
    }
    stages_.resize(p);
    for (int s = 0; s < spec.stages; ++s) {
      ZbStage& st = stages_[size_t(s)];
      if (spec.kind == ScheduleKind::ZBH1) {
        ScheduleSpec one = spec;
        one.kind = ScheduleKind::OneFOneB;
        for (Action a : stage_actions(one, s)) {
          if (a.type == Action::Backward) a.type = Action::Input;
          st.order.push_back(a);
        }
      }
      st.next_forward.assign(size_t(spec.virtual_stages), 0);
      st.next_input.assign(size_t(spec.virtual_stages), 0);
    }
  }

  // Event by event: at the soonest time a stage is free, the first such stage (in stage
  // order) that can run a pass takes it; when none can, they wait until the next output
  // arrives or another stage is free.
  std::vector<std::vector<Action>> run() {
    size_t left = size_t(3) * size_t(spec_.micro_batches) * size_t(place_.virtual_stages());
    while (left > 0) {
      double now = kNotYet;
      for (int s = 0; s < spec_.stages; ++s)
        if (!finished(s)) now = std::min(now, stages_[size_t(s)].free_at);
      bool ran = false;
      for (int s = 0; s < spec_.stages && !ran; ++s) {
        Action a;
        if (!finished(s) && stages_[size_t(s)].free_at == now && choose(s, now, a)) {
          start(s, a);
          --left;
          ran = true;
        }
      }
      if (!ran) wait_after(now);
    }
    std::vector<std::vector<Action>> lists;
    for (ZbStage& st : stages_) lists.push_back(std::move(st.out));
    return lists;
  }

 private:
  void wait_after(double now) {
    while (!arrivals_.empty() && arrivals_.top() <= now) arrivals_.pop();
    double next = arrivals_.empty() ? kNotYet : arrivals_.top();
    for (int s = 0; s < spec_.stages; ++s)
      if (!finished(s) && stages_[size_t(s)].free_at > now)
        next = std::min(next, stages_[size_t(s)].free_at);
    PENTAD_CHECK(next < kNotYet, "{} p {} m {}: no stage can run anything at {}",
                 schedule_name(spec_.kind), spec_.stages, spec_.micro_batches, now);
    for (ZbStage& st : stages_)
      if (st.free_at == now) st.free_at = next;
  }
  bool finished(int s) const {
    return stages_[size_t(s)].out.size() ==
           size_t(3) * size_t(spec_.micro_batches) * size_t(spec_.virtual_stages);
  }
  double cost(int s, const Action& a) const {
    const size_t at = size_t(s) * size_t(chunks_) + size_t(chunks_ > 1 ? a.chunk : 0);
    return costs_[3 * at + (a.type == Action::Forward ? 0 : a.type == Action::Input ? 1 : 2)];
  }
  // When the output of pass (type, micro) of virtual stage vs reaches the stage that takes
  // it (kNotYet: not run yet).
  size_t arrival_index(Action::Type type, int micro, int vs) const {
    return (size_t(micro) * 2 + (type == Action::Forward ? 0 : 1)) *
               size_t(place_.virtual_stages()) +
           size_t(vs);
  }
  double arrival(Action::Type type, int micro, int vs) const {
    return arrive_[arrival_index(type, micro, vs)];
  }
  bool ready(int s, const Action& a, double now) const {
    const int vs = place_.virtual_stage(s, a.chunk);
    if (a.type == Action::Forward)
      return vs == 0 || arrival(Action::Forward, a.micro, vs - 1) <= now;
    // A B: the gradient from the virtual stage above, or the loss after its own forward.
    return vs == last_vs_ ? arrival(Action::Forward, a.micro, vs) <= now
                          : arrival(Action::Input, a.micro, vs + 1) <= now;
  }
  bool choose(int s, double now, Action& a) const {
    const ZbStage& st = stages_[size_t(s)];
    if (spec_.kind == ScheduleKind::ZBH1) return choose_h1(s, st, now, a);
    if (forward_first_ && ready_forward(s, st, now, a)) return true;
    if (ready_input(s, st, now, a)) return true;
    if (!forward_first_ && ready_forward(s, st, now, a)) return true;
    if (take_weight(st, a)) return true;
    // Held full with forwards waiting for their next chunk here, and no W to free one: the
    // deepest chunk's forward goes over the limit, as its B is what frees memory (with
    // uneven costs the first chunk's forwards can fill the stage before any returns).
    const int deepest = spec_.virtual_stages - 1;
    const Action f{Action::Forward, st.next_forward[size_t(deepest)], deepest};
    if (f.micro < spec_.micro_batches && f.micro < st.next_forward[0] && ready(s, f, now)) {
      a = f;
      return true;
    }
    return false;
  }
  bool choose_h1(int s, const ZbStage& st, double now, Action& a) const {
    const int limit = spec_.zb_held_limits.empty() ? spec_.stages : spec_.zb_held_limits[size_t(s)];
    const bool weight_due =
        st.next < st.order.size() && st.order[st.next].type == Action::Forward && st.held >= limit;
    if (st.next < st.order.size() && !weight_due && ready(s, st.order[st.next], now)) {
      a = st.order[st.next];
      return true;
    }
    return take_weight(st, a);
  }
  bool ready_input(int s, const ZbStage& st, double now, Action& a) const {
    bool found = false;
    for (int c = spec_.virtual_stages - 1; c >= 0; --c) {  // deeper chunk first on ties
      const int micro = st.next_input[size_t(c)];
      const Action b{Action::Input, micro, c};
      if (micro < st.next_forward[size_t(c)] && ready(s, b, now) && (!found || micro < a.micro)) {
        a = b;
        found = true;
      }
    }
    return found;
  }
  bool ready_forward(int s, const ZbStage& st, double now, Action& a) const {
    if (st.held >= 2 * spec_.stages) return false;
    for (int c = spec_.virtual_stages - 1; c >= 0; --c) {
      const Action f{Action::Forward, st.next_forward[size_t(c)], c};
      // The reserve: the last place is the deepest chunk's, whose B is what frees memory.
      if (reserve_ && c < spec_.virtual_stages - 1 && st.held + 1 >= 2 * spec_.stages) continue;
      if (f.micro < spec_.micro_batches && ready(s, f, now)) {
        a = f;
        return true;
      }
    }
    return false;
  }
  static bool take_weight(const ZbStage& st, Action& a) {
    if (st.weights.empty()) return false;
    a = st.weights.front();
    return true;
  }
  void start(int s, const Action& a) {
    ZbStage& st = stages_[size_t(s)];
    st.out.push_back(a);
    st.free_at += cost(s, a);
    if (a.type != Action::Weight) {  // its output goes on to the next virtual stage
      const int vs = place_.virtual_stage(s, a.chunk);
      const int to_vs = a.type == Action::Forward ? vs + 1 : vs - 1;
      const bool crosses = to_vs >= 0 && to_vs <= last_vs_ && place_.stage_of(to_vs) != s;
      const double at = st.free_at + (crosses ? costs_.back() : 0.0);
      arrive_[arrival_index(a.type, a.micro, vs)] = at;
      arrivals_.push(at);
    }
    switch (a.type) {
      case Action::Forward:
        ++st.held;
        ++st.next_forward[size_t(a.chunk)];
        break;
      case Action::Input:
        st.weights.push_back({Action::Weight, a.micro, a.chunk});
        ++st.next_input[size_t(a.chunk)];
        break;
      case Action::Weight:
        st.weights.pop_front();
        --st.held;
        return;
      case Action::Backward:
        break;
    }
    if (!st.order.empty()) ++st.next;
  }

  const ScheduleSpec spec_;
  const ChunkPlacement place_;
  const int last_vs_;
  const bool forward_first_;
  const bool reserve_;
  std::vector<double> costs_;  // as ScheduleSpec::zb_costs
  int chunks_ = 1;             // costs per stage: 1, or one per chunk
  std::vector<ZbStage> stages_;
  // Per (micro, forward or B, virtual stage): when the pass's output reaches the next stage.
  std::vector<double> arrive_;
  std::priority_queue<double, std::vector<double>, std::greater<>> arrivals_;  // soonest first
};

// The replay's end: when the last pass of `lists` ends at the spec's costs.
double replay_seconds(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists) {
  return simulate_lists(spec, lists, zero_bubble_sim_costs(spec)).step_seconds;
}

}  // namespace

SimCosts zero_bubble_sim_costs(const ScheduleSpec& spec) {
  SimCosts costs;
  const bool unit = spec.zb_costs.empty();
  const size_t n = unit ? size_t(spec.stages) : (spec.zb_costs.size() - 1) / 3;
  for (size_t i = 0; i < n; ++i) {  // per stage, or per stage and chunk
    costs.forward_seconds.push_back(unit ? 1.0 : spec.zb_costs[3 * i]);
    costs.weight_seconds.push_back(unit ? 1.0 : spec.zb_costs[3 * i + 2]);
    costs.backward_seconds.push_back(costs.weight_seconds.back() +
                                     (unit ? 1.0 : spec.zb_costs[3 * i + 1]));
  }
  costs.transfer_seconds = unit ? 0.0 : spec.zb_costs.back();
  return costs;
}

// The lists of one spec, built from scratch.
namespace {

using Lists = std::vector<std::vector<Action>>;
using SharedLists = std::shared_ptr<const Lists>;

// Results kept for recent specs, at most 4M actions (about 50 MB) in all: every stage of a
// layout asks for the same lists (the memory plan per stage, the executor), and the planner,
// ranking many layouts, for the unit-cost candidates of each (p, m) again and again.
class KeptLists {
 public:
  using Key = std::tuple<int, int, int, int, std::vector<double>, std::vector<int>, int>;
  template <typename Make>
  SharedLists get(const ScheduleSpec& spec, int variant, const Make& make) {
    const Key key{
        int(spec.kind),      spec.stages, spec.micro_batches, spec.virtual_stages, spec.zb_costs,
        spec.zb_held_limits, variant};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = kept_.find(key); it != kept_.end()) return it->second;
    }
    SharedLists lists = std::make_shared<const Lists>(make());
    const size_t actions =
        size_t(3) * size_t(spec.micro_batches) * size_t(spec.stages) * size_t(spec.virtual_stages);
    std::lock_guard<std::mutex> lock(mutex_);
    if (actions_ + actions > (size_t(4) << 20)) kept_.clear(), actions_ = 0;
    if (kept_.emplace(key, lists).second) actions_ += actions;
    return lists;
  }

 private:
  std::mutex mutex_;
  std::map<Key, SharedLists> kept_;
  size_t actions_ = 0;
};
KeptLists kept_lists;

// One replay's lists (variant: B-first 0, forward-first 1, + 2 with the reserve), kept.
SharedLists replayed(const ScheduleSpec& spec, bool forward_first, bool reserve) {
  return kept_lists.get(spec, (forward_first ? 1 : 0) + (reserve ? 2 : 0),
                        [&] { return ZbReplay(spec, forward_first, reserve).run(); });
}

SharedLists shared_lists(const ScheduleSpec& spec);

// Whether `lists` hold, on every stage and each of its v chunks, at most the slots `plan` holds.
bool within_slots(const Lists& lists, const Lists& plan, int v) {
  for (size_t s = 0; s < lists.size(); ++s)
    for (int c = 0; c < v; ++c)
      if (peak_in_flight(lists[s], c) > peak_in_flight(plan[s], c)) return false;
  return true;
}

// Candidates: built at the given costs, at each stage's mean chunk where they are per
// chunk, and at unit costs (the replay is greedy: a W filling a wait at the real costs can
// start just before the input it delays arrives), B-first and, for ZB-V, forward-first, and
// where costs are given each with the reserve too; of those that hold no more slots on any
// stage and chunk than the unit-cost lists (what the memory plan counts: they are among the
// candidates), the one whose replay at the given costs ends first.
Lists best_lists(const ScheduleSpec& spec) {
  std::vector<ScheduleSpec> built = {spec};
  const size_t p = size_t(spec.stages), v = size_t(spec.virtual_stages);
  if (v > 1 && spec.zb_costs.size() == 3 * p * v + 1) {
    ScheduleSpec mean = spec;
    mean.zb_costs.assign(3 * p + 1, 0.0);
    for (size_t i = 0; i + 1 < spec.zb_costs.size(); ++i)
      mean.zb_costs[3 * (i / (3 * v)) + i % 3] += spec.zb_costs[i] / double(v);
    mean.zb_costs.back() = spec.zb_costs.back();
    built.push_back(mean);
  }
  SharedLists plan;
  if (!spec.zb_costs.empty()) {
    built.push_back(spec);
    built.back().zb_costs.clear();
    plan = shared_lists(built.back());
  }
  SharedLists best;
  double best_seconds = kNotYet;
  for (const ScheduleSpec& costs : built)
    for (bool forward_first : {false, true})
      for (bool reserve : {false, true}) {
        if (forward_first && spec.kind != ScheduleKind::ZBV) continue;
        if (reserve && (spec.kind != ScheduleKind::ZBV || !plan)) continue;
        SharedLists lists = replayed(costs, forward_first, reserve);
        if (plan && !within_slots(*lists, *plan, spec.virtual_stages)) continue;
        const double seconds = replay_seconds(spec, *lists);
        if (seconds < best_seconds * (1 - 1e-9)) best = std::move(lists), best_seconds = seconds;
      }
  return *best;
}

SharedLists shared_lists(const ScheduleSpec& spec) {
  PENTAD_CHECK(spec.splits_backward(), "zero_bubble_lists: {} does not split backward",
               schedule_name(spec.kind));
  return kept_lists.get(spec, 4, [&] { return best_lists(spec); });
}

}  // namespace

std::vector<std::vector<Action>> zero_bubble_lists(const ScheduleSpec& spec) {
  return *shared_lists(spec);
}

std::vector<Action> zero_bubble_stage_list(const ScheduleSpec& spec, int stage) {
  return shared_lists(spec)->at(size_t(stage));
}

std::vector<int> zero_bubble_held_limits(const std::vector<double>& slot_bytes,
                                         const std::vector<double>& fixed_bytes) {
  const int p = int(slot_bytes.size());
  const auto fixed = [&](int s) { return fixed_bytes.empty() ? 0.0 : fixed_bytes[size_t(s)]; };
  double fullest = 0;  // 1F1B's: stage s holds p - s micro-batches
  for (int s = 0; s < p; ++s)
    fullest = std::max(fullest, fixed(s) + double(p - s) * slot_bytes[size_t(s)]);
  std::vector<int> limits;
  bool all_p = true;
  for (int s = 0; s < p; ++s) {
    const double fit =
        slot_bytes[size_t(s)] > 0 ? (fullest - fixed(s)) / slot_bytes[size_t(s)] : double(p);
    // (1e-9: p - s slots that are 1F1B's fullest fit exactly, whatever the rounding)
    limits.push_back(std::clamp(int(std::floor(fit + 1e-9)), p - s, p));
    all_p = all_p && limits.back() == p;
  }
  return all_p ? std::vector<int>{} : limits;
}

}  // namespace pentad::parallel::pp
