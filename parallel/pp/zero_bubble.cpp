// The zero-bubble schedules' lists (parallel/pp/schedule.h): built by replaying every stage
// at unit cost (F = B = W = one tick, transfers free), each stage choosing its next pass
// when the last one ends, as the papers' hand-made schedules do:
//   ZB-H1: 1F1B's order of forwards and Bs. A W runs when the next of those has no input
//          yet (what 1F1B would spend waiting) or when the next forward would hold more
//          than p micro-batches (1F1B's peak, on stage 0); the Ws left run at the end.
//   ZB-V:  a ready B first (the oldest micro-batch; on a tie the chunk deeper in the
//          model, whose gradient has further to go), then a ready forward (the deeper chunk
//          first, finishing micro-batches early) while fewer than 2p chunk passes are held
//          (1F1B's peak in half-stage chunks), then a W.
// The lists keep the order of one feasible run, so they run without deadlock whatever the
// real costs: a pass only ever waits for passes that come before it in that run.
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "core/check.h"
#include "parallel/pp/schedule.h"

namespace pentad::parallel::pp {

namespace {

constexpr int kNotYet = std::numeric_limits<int>::max();

// One stage's state during the replay.
struct ZbStage {
  std::vector<Action> order;       // ZB-H1: 1F1B's forwards and Bs, in order
  size_t next = 0;                 // ZB-H1: into order
  std::vector<int> next_forward;   // ZB-V: per chunk, the next micro-batch to forward
  std::vector<int> next_input;     // ZB-V: per chunk, the next micro-batch's B
  std::deque<Action> weights;      // Bs whose W has not run, oldest first
  int held = 0;                    // micro-batches (chunk passes) between forward and W
  std::vector<Action> out;
};

class ZbReplay {
 public:
  explicit ZbReplay(const ScheduleSpec& spec)
      : spec_(spec), place_(spec.placement()), last_vs_(place_.virtual_stages() - 1) {
    stages_.resize(size_t(spec.stages));
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

  std::vector<std::vector<Action>> run() {
    const size_t total = size_t(3) * size_t(spec_.micro_batches) * size_t(place_.virtual_stages());
    size_t placed = 0;
    for (int tick = 0; placed < total; ++tick) {
      std::vector<std::pair<int, Action>> chosen;  // passes starting at this tick
      for (int s = 0; s < spec_.stages; ++s) {
        Action a;
        if (choose(s, tick, a)) chosen.push_back({s, a});
      }
      PENTAD_CHECK(!chosen.empty(), "{} p {} m {}: no pass can start at tick {}",
                   schedule_name(spec_.kind), spec_.stages, spec_.micro_batches, tick);
      for (const auto& [s, a] : chosen) {
        start(s, a, tick);
        ++placed;
      }
    }
    std::vector<std::vector<Action>> lists;
    for (ZbStage& st : stages_) lists.push_back(std::move(st.out));
    return lists;
  }

 private:
  // Tick at whose start pass (type, micro, virtual stage) has ended (kNotYet: it has not).
  int done(Action::Type type, int micro, int vs) const {
    auto it = done_.find({int(type), micro, vs});
    return it == done_.end() ? kNotYet : it->second;
  }
  bool ready(int s, const Action& a, int tick) const {
    const int vs = place_.virtual_stage(s, a.chunk);
    if (a.type == Action::Forward) return vs == 0 || done(Action::Forward, a.micro, vs - 1) <= tick;
    // A B: the gradient from the virtual stage above, or the loss after its own forward.
    return vs == last_vs_ ? done(Action::Forward, a.micro, vs) <= tick
                          : done(Action::Input, a.micro, vs + 1) <= tick;
  }
  bool choose(int s, int tick, Action& a) const {
    const ZbStage& st = stages_[size_t(s)];
    return spec_.kind == ScheduleKind::ZBH1 ? choose_h1(s, st, tick, a) : choose_v(s, st, tick, a);
  }
  bool choose_h1(int s, const ZbStage& st, int tick, Action& a) const {
    const bool weight_due = st.next < st.order.size() &&
                            st.order[st.next].type == Action::Forward && st.held >= spec_.stages;
    if (st.next < st.order.size() && !weight_due && ready(s, st.order[st.next], tick)) {
      a = st.order[st.next];
      return true;
    }
    return take_weight(st, a);
  }
  bool choose_v(int s, const ZbStage& st, int tick, Action& a) const {
    const int m = spec_.micro_batches;
    bool found = false;
    for (int c = spec_.virtual_stages - 1; c >= 0; --c) {  // deeper chunk first on ties
      const int micro = st.next_input[size_t(c)];
      const Action b{Action::Input, micro, c};
      if (micro < st.next_forward[size_t(c)] && micro < m && ready(s, b, tick) &&
          (!found || micro < a.micro)) {
        a = b;
        found = true;
      }
    }
    if (found) return true;
    if (st.held < 2 * spec_.stages)
      for (int c = spec_.virtual_stages - 1; c >= 0; --c) {
        const Action f{Action::Forward, st.next_forward[size_t(c)], c};
        if (f.micro < m && ready(s, f, tick)) {
          a = f;
          return true;
        }
      }
    return take_weight(st, a);
  }
  static bool take_weight(const ZbStage& st, Action& a) {
    if (st.weights.empty()) return false;
    a = st.weights.front();
    return true;
  }
  void start(int s, const Action& a, int tick) {
    ZbStage& st = stages_[size_t(s)];
    st.out.push_back(a);
    done_[{int(a.type), a.micro, place_.virtual_stage(s, a.chunk)}] = tick + 1;
    switch (a.type) {
      case Action::Forward:
        ++st.held;
        if (st.order.empty()) ++st.next_forward[size_t(a.chunk)];
        break;
      case Action::Input:
        st.weights.push_back({Action::Weight, a.micro, a.chunk});
        if (st.order.empty()) ++st.next_input[size_t(a.chunk)];
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
  std::vector<ZbStage> stages_;
  std::map<std::tuple<int, int, int>, int> done_;  // (type, micro, virtual stage) -> end tick
};

}  // namespace

std::vector<std::vector<Action>> zero_bubble_lists(const ScheduleSpec& spec) {
  PENTAD_CHECK(spec.splits_backward(), "zero_bubble_lists: {} does not split backward",
               schedule_name(spec.kind));
  return ZbReplay(spec).run();
}

}  // namespace pentad::parallel::pp
