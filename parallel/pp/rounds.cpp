#include "parallel/pp/rounds.h"

#include <map>
#include <tuple>

#include "core/check.h"

namespace pentad::parallel::pp {

RoundPlan plan_rounds(const std::vector<std::vector<Action>>& lists,
                      const ChunkPlacement& placement, int stage) {
  const int p = static_cast<int>(lists.size());
  PENTAD_CHECK(p == placement.stages && stage >= 0 && stage < p && placement.chunks >= 1,
               "stage {} of {} ({} placed)", stage, p, placement.stages);
  const int last_vs = placement.virtual_stages() - 1;
  // Round in which each transfer was produced: key (type, micro, to_virtual_stage).
  std::map<std::tuple<int, int, int>, int> produced;
  std::vector<size_t> next(size_t(p), 0);
  size_t remaining = 0;
  for (const auto& list : lists) remaining += list.size();
  RoundPlan plan;
  plan.round_of_action.assign(lists[size_t(stage)].size(), -1);
  for (int round = 0; remaining > 0; ++round) {
    std::vector<Transfer> made;  // this round's transfers, in stage order
    bool ran = false;
    for (int s = 0; s < p; ++s) {
      if (next[size_t(s)] == lists[size_t(s)].size()) continue;
      const Action& a = lists[size_t(s)][next[size_t(s)]];
      const int vs = placement.virtual_stage(s, a.chunk);
      const bool forward = a.type == Action::Forward, weight = a.type == Action::Weight;
      const bool needs_input = !weight && (forward ? vs > 0 : vs < last_vs);
      if (needs_input) {
        auto it = produced.find({int(carried(a.type)), a.micro, vs});
        if (it == produced.end() || it->second >= round) continue;  // not here yet
      }
      if (s == stage) plan.round_of_action[next[size_t(s)]] = round;
      ++next[size_t(s)];
      --remaining;
      ran = true;
      const bool sends = !weight && (forward ? vs < last_vs : vs > 0);
      if (!sends) continue;
      const int to_vs = forward ? vs + 1 : vs - 1;
      made.push_back({carried(a.type), a.micro, to_vs, s, placement.stage_of(to_vs)});
      produced[{int(carried(a.type)), a.micro, to_vs}] = round;
    }
    // A round without a pass produced nothing, so no later round could run one either.
    PENTAD_CHECK(ran, "pipeline lists cannot run: no pass can start in round {}", round);
    std::vector<Transfer> mine;
    for (const Transfer& t : made)
      if (t.from_stage == stage || t.to_stage == stage) mine.push_back(t);
    plan.groups.push_back(std::move(mine));
  }
  return plan;
}

}  // namespace pentad::parallel::pp
