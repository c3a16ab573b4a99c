#include "parallel/pp/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace pentad::parallel::pp {

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::KFKB:
      return "kfkb";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::ZBH1:
      return "zb-h1";
    case ScheduleKind::ZBV:
      return "zb-v";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::KFKB,
                            ScheduleKind::Interleaved, ScheduleKind::ZBH1, ScheduleKind::ZBV})
    if (name == schedule_name(kind)) return kind;
  fail(
      "pipeline schedule \"{}\" is not known: use gpipe, 1f1b, kfkb, interleaved, zb-h1 or "
      "zb-v",
      name);
}

void check_schedule(const ScheduleSpec& s) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  PENTAD_CHECK(p >= 1 && m >= 1 && v >= 1, "bad schedule sizes p {} m {} v {}", p, m, v);
  if (p * v > 63)  // message tags (parallel/pp/pipeline.cpp) stay within MPI's range
    fail(
        "parallel.pp = {} x parallel.virtual_stages = {} = {} virtual stages; at most 63 are "
        "supported: lower parallel.virtual_stages",
        p, v, p * v);
  if (s.kind == ScheduleKind::ZBV && v != 2)
    fail("the zb-v schedule runs two chunks per stage: set parallel.virtual_stages = 2 (it is {})",
         v);
  if (v > 1 && s.kind != ScheduleKind::Interleaved && s.kind != ScheduleKind::ZBV)
    fail(
        "parallel.virtual_stages = {} needs parallel.pp_schedule = \"interleaved\" or \"zb-v\" "
        "(it is \"{}\")",
        v, schedule_name(s.kind));
  if (s.kind == ScheduleKind::Interleaved) {
    if (p < 2) fail("the interleaved schedule needs parallel.pp >= 2");
    if (m % p != 0)
      fail(
          "the interleaved schedule runs micro-batches in rounds of pp = {}: train.grad_accum "
          "= {} is not a multiple of {}; change train.grad_accum (or parallel.pp)",
          p, m, p);
  }
  if (s.kind == ScheduleKind::KFKB && (s.group < 1 || s.group > m))
    fail("parallel.pp_group = {} must be between 1 and train.grad_accum = {}", s.group, m);
}

namespace {

// 1F1B over groups of k micro-batches, one chunk: warm-up groups, then one group forward /
// one group backward, then the remaining backwards.
std::vector<Action> grouped(int p, int m, int k, int stage) {
  const int groups = (m + k - 1) / k;
  const int warmup = std::min(p - stage - 1, groups);
  std::vector<Action> out;
  auto run = [&](Action::Type type, int g) {
    for (int i = g * k; i < std::min(m, (g + 1) * k); ++i) out.push_back({type, i, 0});
  };
  for (int g = 0; g < warmup; ++g) run(Action::Forward, g);
  for (int g = 0; g < groups - warmup; ++g) {
    run(Action::Forward, warmup + g);
    run(Action::Backward, g);
  }
  for (int g = groups - warmup; g < groups; ++g) run(Action::Backward, g);
  return out;
}

// Megatron-Core's interleaved order: micro-batches go through the chunks in rounds of p;
// forwards visit chunks 0..v-1, backwards v-1..0.
std::vector<Action> interleaved(int p, int m, int v, int stage) {
  const int total = m * v;
  auto at = [&](int i, bool forward) {
    const int round = i % (p * v);
    const int chunk = forward ? round / p : v - 1 - round / p;
    return Action{forward ? Action::Forward : Action::Backward, (i / (p * v)) * p + i % p, chunk};
  };
  const int warmup = m == p ? total : std::min(total, (p - stage - 1) * 2 + (v - 1) * p);
  std::vector<Action> out;
  for (int i = 0; i < warmup; ++i) out.push_back(at(i, true));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(at(warmup + i, true));
    out.push_back(at(i, false));
  }
  for (int i = total - warmup; i < total; ++i) out.push_back(at(i, false));
  return out;
}

}  // namespace

std::vector<Action> stage_actions(const ScheduleSpec& s, int stage) {
  check_schedule(s);
  PENTAD_CHECK(stage >= 0 && stage < s.stages, "stage {} of {}", stage, s.stages);
  switch (s.kind) {
    case ScheduleKind::ZBH1:
    case ScheduleKind::ZBV:
      return zero_bubble_stage_list(s, stage);
    case ScheduleKind::GPipe:
      return grouped(s.stages, s.micro_batches, s.micro_batches, stage);
    case ScheduleKind::OneFOneB:
      return grouped(s.stages, s.micro_batches, 1, stage);
    case ScheduleKind::KFKB:
      return grouped(s.stages, s.micro_batches, s.group, stage);
    case ScheduleKind::Interleaved:
      return interleaved(s.stages, s.micro_batches, s.virtual_stages, stage);
  }
  return {};
}

std::vector<std::vector<Action>> schedule_actions(const ScheduleSpec& s) {
  if (s.splits_backward()) {
    check_schedule(s);
    return zero_bubble_lists(s);
  }
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < s.stages; ++stage) lists.push_back(stage_actions(s, stage));
  return lists;
}

int peak_in_flight(const std::vector<Action>& actions, int chunk) {
  int alive = 0, peak = 0;
  for (const Action& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    if (a.type == Action::Forward) ++alive;
    if (a.type == Action::Backward || a.type == Action::Weight) --alive;
    peak = std::max(peak, alive);
  }
  return peak;
}

double SimResult::bubble_fraction() const {
  if (busy_seconds.empty() || step_seconds <= 0) return 0.0;
  double busy = 0.0;
  for (double b : busy_seconds) busy += b;
  return 1.0 - busy / (static_cast<double>(busy_seconds.size()) * step_seconds);
}

namespace {

// The transfers of a replay: when each pass's input arrives at its stage, the messages on
// one directed link going one at a time.
class Transfers {
 public:
  Transfers(const ChunkPlacement& placement, int micro_batches, const SimCosts& costs)
      : p_(placement.stages),
        vstages_(placement.virtual_stages()),
        place_(placement),
        seconds_(!costs.link_seconds.empty()
                     ? costs.link_seconds
                     : std::vector<double>(size_t(p_) * size_t(p_), costs.transfer_seconds)),
        arrival_(size_t(2) * size_t(micro_batches) * size_t(vstages_), -1.0),
        link_free_(size_t(p_) * size_t(p_), 0.0) {}
  // When the input of stage s's pass a is there: 0 if it needs none (the first forward,
  // the last backward; a backward's own forward ran earlier on the same stage), -1 if it
  // has not been sent yet.
  // (W needs none: it follows its own B on the same stage.)
  double ready_at(int s, const Action& a) const {
    if (a.type == Action::Weight) return 0.0;
    const int vs = place_.virtual_stage(s, a.chunk);
    const bool needs_input = a.type == Action::Forward ? vs > 0 : vs < vstages_ - 1;
    if (!needs_input) return 0.0;
    return arrival_[index(carried(a.type), a.micro, vs)];
  }
  // Stage s finished pass a at `end`: its output leaves for the next virtual stage.
  // Returns the stage it goes to (-1: none).
  int send(int s, const Action& a, double end) {
    if (a.type == Action::Weight) return -1;
    const int vs = place_.virtual_stage(s, a.chunk);
    const int to_vs = a.type == Action::Forward ? vs + 1 : vs - 1;
    if (to_vs < 0 || to_vs >= vstages_) return -1;
    const int to = place_.stage_of(to_vs);
    const size_t link = size_t(s) * size_t(p_) + size_t(to);
    double& free = link_free_[link];
    free = std::max(end, free) + seconds_[link];
    arrival_[index(carried(a.type), a.micro, to_vs)] = free;
    return to;
  }

 private:
  size_t index(Action::Type type, int micro, int vs) const {
    return (size_t(micro) * 2 + size_t(type)) * size_t(vstages_) + size_t(vs);
  }
  const int p_, vstages_;
  const ChunkPlacement place_;
  const std::vector<double> seconds_;  // per directed link
  // Flat tables (the planner simulates every layout it ranks): each (micro, type, virtual
  // stage)'s arrival, -1 until sent, and each directed link's (from, to stage) free time.
  std::vector<double> arrival_;
  std::vector<double> link_free_;
};

// How many costs a stage has: 1, or its chunks' (SimCosts per stage and chunk).
int cost_chunks(const ScheduleSpec& spec, const SimCosts& costs) {
  return costs.forward_seconds.size() == size_t(spec.stages) ? 1 : spec.virtual_stages;
}

// Pass `index` of stage s's list, a, at full speed (chunks: cost_chunks).
double pass_seconds(const SimCosts& costs, int s, int chunks, const Action& a, size_t index) {
  if (!costs.timed_seconds.empty()) return costs.timed_seconds[size_t(s)][index];
  const size_t at = size_t(s) * size_t(chunks) + size_t(chunks > 1 ? a.chunk : 0);
  const double backward = costs.backward_seconds[at];
  const double weight = costs.weight_seconds.empty() ? backward / 2 : costs.weight_seconds[at];
  switch (a.type) {
    case Action::Forward:
      return costs.forward_seconds[at];
    case Action::Backward:
      return backward;
    case Action::Input:
      return backward - weight;
    case Action::Weight:
      return weight;
  }
  return 0.0;
}

// simulate() on shared cores: time advances from event to event (a pass ends, an input
// arrives); between them every running stage progresses at its node's shared rate.
SimResult simulate_shared(const ScheduleSpec& spec, const SimCosts& costs,
                          const std::vector<std::vector<Action>>& lists, SimResult r) {
  const int p = spec.stages;
  const int per_node = std::clamp(costs.stages_per_node, 1, p);
  const int chunks = cost_chunks(spec, costs);
  Transfers transfers(spec.placement(), spec.micro_batches, costs);
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> left(size_t(p), -1.0), started(size_t(p), 0.0);  // left < 0: not running
  double now = 0.0;
  size_t remaining = 0;
  for (const auto& list : lists) remaining += list.size();
  while (remaining > 0) {
    double soonest_input = std::numeric_limits<double>::infinity();
    for (int s = 0; s < p; ++s) {  // idle stages start what has arrived
      if (left[size_t(s)] >= 0 || next[size_t(s)] == lists[size_t(s)].size()) continue;
      const Action& a = lists[size_t(s)][next[size_t(s)]];
      const double ready = transfers.ready_at(s, a);
      if (ready >= 0 && ready <= now) {
        left[size_t(s)] = pass_seconds(costs, s, chunks, a, next[size_t(s)]);
        started[size_t(s)] = now;
      } else if (ready > now) {
        soonest_input = std::min(soonest_input, ready);
      }
    }
    std::vector<double> rate(size_t(p), 0.0);
    double dt = soonest_input - now;
    for (int s = 0; s < p; ++s) {
      if (left[size_t(s)] < 0) continue;
      int running = 0;
      for (int o = s / per_node * per_node; o < std::min(p, (s / per_node + 1) * per_node); ++o)
        running += left[size_t(o)] >= 0 ? 1 : 0;
      rate[size_t(s)] = std::min(1.0, costs.core_share / running);
      dt = std::min(dt, left[size_t(s)] / rate[size_t(s)]);
    }
    if (!std::isfinite(dt)) {  // nothing runs and nothing is on its way
      r.deadlock = true;
      return r;
    }
    now += dt;
    for (int s = 0; s < p; ++s) {
      if (left[size_t(s)] < 0) continue;
      left[size_t(s)] -= dt * rate[size_t(s)];
      if (left[size_t(s)] > 1e-12 * (1.0 + now)) continue;
      left[size_t(s)] = -1.0;
      const Action a = lists[size_t(s)][next[size_t(s)]++];
      --remaining;
      r.busy_seconds[size_t(s)] += now - started[size_t(s)];
      r.step_seconds = std::max(r.step_seconds, now);
      transfers.send(s, a, now);
    }
  }
  return r;
}

}  // namespace

SimResult simulate(const ScheduleSpec& spec, const SimCosts& costs) {
  return simulate_lists(spec, schedule_actions(spec), costs);
}

SimResult simulate_lists(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& lists,
                         const SimCosts& costs) {
  const int p = spec.stages;
  const size_t per_chunk = size_t(p) * size_t(spec.virtual_stages);
  const size_t n = costs.forward_seconds.size();
  PENTAD_CHECK((n == size_t(p) || n == per_chunk) && costs.backward_seconds.size() == n,
               "simulate: {} stages of {} chunks but {} forward and {} backward costs", p,
               spec.virtual_stages, n, costs.backward_seconds.size());
  PENTAD_CHECK(costs.link_seconds.empty() || costs.link_seconds.size() == size_t(p) * size_t(p),
               "simulate: {} stages but {} link times (stages x stages)", p,
               costs.link_seconds.size());
  PENTAD_CHECK(costs.weight_seconds.empty() || costs.weight_seconds.size() == n,
               "simulate: {} forward costs but {} W costs", n, costs.weight_seconds.size());
  PENTAD_CHECK(int(lists.size()) == p, "simulate: {} stages but {} lists", p, lists.size());
  PENTAD_CHECK(costs.timed_seconds.empty() || costs.timed_seconds.size() == size_t(p),
               "simulate: {} stages but {} stages' timed passes", p, costs.timed_seconds.size());
  for (size_t s = 0; s < costs.timed_seconds.size(); ++s)
    PENTAD_CHECK(costs.timed_seconds[s].size() == lists[s].size(),
                 "simulate: stage {} has {} passes but {} timed", s, lists[s].size(),
                 costs.timed_seconds[s].size());
  SimResult r;
  for (const std::vector<Action>& list : lists) r.peak_in_flight.push_back(peak_in_flight(list));
  r.busy_seconds.assign(static_cast<size_t>(p), 0.0);
  if (costs.core_share > 0) return simulate_shared(spec, costs, lists, std::move(r));
  Transfers transfers(spec.placement(), spec.micro_batches, costs);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  const int chunks = cost_chunks(spec, costs);
  // Each stage's next pass: when it can start (infinity: its input has not been sent, or
  // nothing is left). The pass run next is the earliest (ties: the lowest stage), so links
  // serve messages in time order. Running a pass changes only its own stage's next start
  // and the receiving stage's.
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<double> start_at(static_cast<size_t>(p), kNever);
  auto update = [&](int s) {
    start_at[size_t(s)] = kNever;
    if (next[size_t(s)] == lists[size_t(s)].size()) return;
    const double arrival = transfers.ready_at(s, lists[size_t(s)][next[size_t(s)]]);
    if (arrival >= 0) start_at[size_t(s)] = std::max(arrival, clock[size_t(s)]);
  };
  for (int s = 0; s < p; ++s) update(s);
  size_t remaining = 0;
  for (const auto& list : lists) remaining += list.size();
  while (remaining > 0) {
    const int best = int(std::min_element(start_at.begin(), start_at.end()) - start_at.begin());
    const double start = start_at[size_t(best)];
    if (start == kNever) {
      r.deadlock = true;
      return r;
    }
    const size_t index = next[size_t(best)]++;
    const Action a = lists[size_t(best)][index];
    --remaining;
    const double cost = pass_seconds(costs, best, chunks, a, index);
    const double end = start + cost;
    clock[size_t(best)] = end;
    r.busy_seconds[size_t(best)] += cost;
    r.step_seconds = std::max(r.step_seconds, end);
    const int to = transfers.send(best, a, end);
    update(best);
    if (to >= 0 && to != best) update(to);
  }
  return r;
}

GroupChoice choose_group(ScheduleSpec spec, const SimCosts& costs,
                         const std::vector<double>& slot_bytes, double limit_bytes) {
  spec.kind = ScheduleKind::KFKB;
  GroupChoice best;
  double best_seconds = std::numeric_limits<double>::infinity();
  for (int k = 1; k <= spec.micro_batches; ++k) {
    spec.group = k;
    const SimResult r = simulate(spec, costs);
    if (k == 1) best.one_f_one_b_seconds = r.step_seconds;
    bool fits = true;
    for (int s = 0; s < spec.stages; ++s)
      fits = fits && double(r.peak_in_flight[size_t(s)]) * slot_bytes.at(size_t(s)) <= limit_bytes;
    if (fits && !r.deadlock && r.step_seconds < best_seconds * (1 - 1e-9)) {
      best.group = k;
      best.step_seconds = best_seconds = r.step_seconds;
    }
  }
  return best;
}

double ideal_bubble_fraction(const ScheduleSpec& spec) {
  const double p = spec.stages, m = spec.micro_batches, v = spec.virtual_stages;
  if (spec.kind != ScheduleKind::KFKB && !spec.splits_backward()) return (p - 1) / (v * m + p - 1);
  SimCosts unit;
  unit.forward_seconds.assign(size_t(spec.stages), 1.0);
  unit.backward_seconds.assign(size_t(spec.stages), 2.0);
  ScheduleSpec at_unit = spec;  // the zero-bubble lists built for these costs
  at_unit.zb_costs.clear();
  return simulate(at_unit, unit).bubble_fraction();
}

}  // namespace pentad::parallel::pp
