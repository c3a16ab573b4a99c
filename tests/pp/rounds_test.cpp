// Transfer rounds (parallel/pp/rounds.h) against a model of NCCL's semantics: every
// stage's posting order replayed with in-order streams, order-matched sends and receives and
// group-wise progress must finish every transfer, each receive matched with the send it
// expects. The same model deadlocks on the one-pass-ahead order the executor uses for MPI,
// which is why device transfers go in rounds.
#include "parallel/pp/rounds.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "core/check.h"

namespace pentad::parallel::pp {
namespace {

struct Op {
  bool is_send = true;
  Transfer transfer;
};
// One stage's issue order: a pass on the compute stream, or a group on the comm stream.
struct Event {
  std::optional<size_t> pass;  // index in the stage's action list
  std::vector<Op> group;
};

// Replays every stage's events with NCCL's semantics and returns "" or what went wrong:
//  - compute stream: passes in order; a pass needing input waits for that receive's group;
//  - comm stream: groups in order; a group starts once the passes issued before it are done,
//    and finishes once, for each of its ops, the peer's group holding the matching op has
//    started (ops of a group progress together);
//  - the n-th send from a to b matches the n-th receive at b from a, whatever they carry.
std::string replay(const std::vector<std::vector<Action>>& lists, const ChunkPlacement& place,
                   const std::vector<std::vector<Event>>& events) {
  const int p = int(lists.size()), last_vs = place.virtual_stages() - 1;
  struct Side {
    size_t pass = 0, group = 0;          // next compute / group position (in events)
    std::vector<size_t> passes, groups;  // event indices
    std::set<size_t> started;            // groups started (event index)
    std::set<size_t> done_groups;
    size_t passes_done = 0;
  };
  std::vector<Side> side(static_cast<size_t>(p));
  // Matching by order per directed pair: (from, to) -> events holding its n-th send / recv.
  std::map<std::pair<int, int>, std::vector<std::pair<size_t, Transfer>>> sends, recvs;
  std::map<std::tuple<int, int, int, int>, size_t> recv_event;  // (stage, type, micro, vs)
  for (int s = 0; s < p; ++s)
    for (size_t e = 0; e < events[size_t(s)].size(); ++e) {
      const Event& ev = events[size_t(s)][e];
      (ev.pass ? side[size_t(s)].passes : side[size_t(s)].groups).push_back(e);
      for (const Op& op : ev.group) {
        const Transfer& t = op.transfer;
        if (op.is_send)
          sends[{s, t.to_stage}].push_back({e, t});
        else {
          recvs[{t.from_stage, s}].push_back({e, t});
          recv_event[{s, int(t.type), t.micro, t.to_virtual_stage}] = e;
        }
      }
    }
  // Each op's partner group: (stage, event) -> list of (peer stage, peer event).
  std::map<std::pair<int, size_t>, std::vector<std::pair<int, size_t>>> partners;
  for (const auto& [link, list] : sends) {
    const auto& other = recvs[link];
    if (other.size() != list.size())
      return fmt::format("{} sends but {} receives from stage {} to {}", list.size(), other.size(),
                         link.first, link.second);
    for (size_t n = 0; n < list.size(); ++n) {
      if (!(list[n].second == other[n].second))
        return fmt::format(
            "stage {} to {}: send {} carries micro-batch {} to virtual stage {}, "
            "the receive expects micro-batch {} to virtual stage {}",
            link.first, link.second, n, list[n].second.micro, list[n].second.to_virtual_stage,
            other[n].second.micro, other[n].second.to_virtual_stage);
      partners[{link.first, list[n].first}].push_back({link.second, other[n].first});
      partners[{link.second, other[n].first}].push_back({link.first, list[n].first});
    }
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      Side& me = side[size_t(s)];
      // Compute: the next pass, once its input's group is done.
      while (me.pass < me.passes.size()) {
        const Action& a = lists[size_t(s)][*events[size_t(s)][me.passes[me.pass]].pass];
        const int vs = place.virtual_stage(s, a.chunk);
        const bool needs =
            a.type != Action::Weight && (a.type == Action::Forward ? vs > 0 : vs < last_vs);
        if (needs) {
          auto it = recv_event.find({s, int(carried(a.type)), a.micro, vs});
          if (it == recv_event.end()) return fmt::format("stage {}: an input never posted", s);
          if (!me.done_groups.count(it->second)) break;
        }
        ++me.pass;
        ++me.passes_done;
        progress = true;
      }
      // Comm: start the head group once the passes issued before it are done.
      if (me.group < me.groups.size() && !me.started.count(me.groups[me.group])) {
        const size_t e = me.groups[me.group];
        size_t passes_before = 0;
        while (passes_before < me.passes.size() && me.passes[passes_before] < e) ++passes_before;
        if (me.passes_done >= passes_before) {
          me.started.insert(e);
          progress = true;
        }
      }
    }
    // Finish started head groups whose partners have all started.
    for (int s = 0; s < p; ++s) {
      Side& me = side[size_t(s)];
      if (me.group == me.groups.size() || !me.started.count(me.groups[me.group])) continue;
      const size_t e = me.groups[me.group];
      bool ready = true;
      for (const auto& [peer, pe] : partners[{s, e}])
        ready = ready && side[size_t(peer)].started.count(pe);
      if (ready) {
        me.done_groups.insert(e);
        ++me.group;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    if (side[size_t(s)].pass < side[size_t(s)].passes.size() ||
        side[size_t(s)].group < side[size_t(s)].groups.size())
      return fmt::format("deadlock: stage {} stopped at pass {} of {}, group {} of {}", s,
                         side[size_t(s)].pass, side[size_t(s)].passes.size(), side[size_t(s)].group,
                         side[size_t(s)].groups.size());
  return "";
}

// The transfer a pass consumes.
Transfer input_of(const Action& a, int s, const ChunkPlacement& place) {
  const int vs = place.virtual_stage(s, a.chunk),
            from = a.type == Action::Forward ? vs - 1 : vs + 1;
  return {carried(a.type), a.micro, vs, place.stage_of(from), s};
}
std::optional<Transfer> output_of(const Action& a, int s, const ChunkPlacement& place) {
  const int vs = place.virtual_stage(s, a.chunk), last = place.virtual_stages() - 1;
  if (a.type == Action::Weight || (a.type == Action::Forward ? vs == last : vs == 0))
    return std::nullopt;
  const int to = a.type == Action::Forward ? vs + 1 : vs - 1;
  return Transfer{carried(a.type), a.micro, to, s, place.stage_of(to)};
}
bool needs_input(const Action& a, int s, const ChunkPlacement& place) {
  const int vs = place.virtual_stage(s, a.chunk);
  return a.type != Action::Weight &&
         (a.type == Action::Forward ? vs > 0 : vs < place.virtual_stages() - 1);
}

// The pipeline's device order (pipeline.cpp): idle rounds' groups, the pass, its round's group.
std::vector<std::vector<Event>> rounds_order(const std::vector<std::vector<Action>>& lists,
                                             const ChunkPlacement& place) {
  const int p = int(lists.size());
  std::vector<std::vector<Event>> events(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    const RoundPlan plan = plan_rounds(lists, place, s);
    int posted = 0;
    auto post_until = [&](int until) {
      for (; posted <= until && posted < int(plan.groups.size()); ++posted) {
        Event ev;
        for (const Transfer& t : plan.groups[size_t(posted)]) {
          if (t.from_stage == s) ev.group.push_back({true, t});
          if (t.to_stage == s) ev.group.push_back({false, t});
        }
        if (!ev.group.empty()) events[size_t(s)].push_back(ev);
      }
    };
    for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
      post_until(plan.round_of_action[i] - 1);
      events[size_t(s)].push_back({i, {}});
      post_until(plan.round_of_action[i]);
    }
    post_until(int(plan.groups.size()));
  }
  return events;
}

// The pipeline's host order: each receive one pass ahead (or just before its pass), each send
// right after its pass, every op on its own.
std::vector<std::vector<Event>> one_ahead_order(const std::vector<std::vector<Action>>& lists,
                                                const ChunkPlacement& place) {
  const int p = int(lists.size());
  std::vector<std::vector<Event>> events(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    const auto& list = lists[size_t(s)];
    std::set<size_t> posted;
    auto post = [&](size_t i) {
      if (i < list.size() && needs_input(list[i], s, place) && posted.insert(i).second)
        events[size_t(s)].push_back({std::nullopt, {{false, input_of(list[i], s, place)}}});
    };
    for (size_t i = 0; i < list.size(); ++i) {
      post(i + 1);
      post(i);
      events[size_t(s)].push_back({i, {}});
      if (auto out = output_of(list[i], s, place))
        events[size_t(s)].push_back({std::nullopt, {{true, *out}}});
    }
  }
  return events;
}

std::vector<std::vector<Action>> lists_of(const ScheduleSpec& spec) {
  return schedule_actions(spec);
}

TEST(Rounds, EveryScheduleFinishesUnderNcclOrdering) {
  int checked = 0;
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      std::vector<ScheduleSpec> specs = {{ScheduleKind::GPipe, p, m, 1, 1},
                                         {ScheduleKind::OneFOneB, p, m, 1, 1}};
      for (int k = 1; k <= m; ++k) specs.push_back({ScheduleKind::KFKB, p, m, 1, k});
      if (m % p == 0)
        for (int v : {2, 3}) specs.push_back({ScheduleKind::Interleaved, p, m, v, 1});
      specs.push_back({ScheduleKind::ZBH1, p, m, 1, 1});
      specs.push_back({ScheduleKind::ZBV, p, m, 2, 1});
      for (const ScheduleSpec& spec : specs) {
        const auto lists = lists_of(spec);
        EXPECT_EQ(replay(lists, spec.placement(), rounds_order(lists, spec.placement())), "")
            << schedule_name(spec.kind) << " p" << p << " m" << m << " v" << spec.virtual_stages
            << " k" << spec.group;
        ++checked;
      }
      // Evaluation: every micro-batch through every chunk, forward only.
      for (const ChunkPlacement place :
           {ChunkPlacement{p, 1, false}, ChunkPlacement{p, 2, false}, ChunkPlacement{p, 2, true}}) {
        std::vector<Action> eval;
        for (int micro = 0; micro < m; ++micro)
          for (int c = 0; c < place.chunks; ++c) eval.push_back({Action::Forward, micro, c});
        const std::vector<std::vector<Action>> lists(static_cast<size_t>(p), eval);
        EXPECT_EQ(replay(lists, place, rounds_order(lists, place)), "")
            << "evaluate p" << p << " m" << m << " v" << place.chunks << " vee " << place.vee;
      }
    }
  EXPECT_GT(checked, 100);
}

TEST(Rounds, BothEndsPostATransferInTheSameRound) {
  const ScheduleSpec spec{ScheduleKind::Interleaved, 4, 8, 2, 1};
  const auto lists = lists_of(spec);
  std::vector<RoundPlan> plans;
  for (int s = 0; s < spec.stages; ++s) plans.push_back(plan_rounds(lists, spec.placement(), s));
  for (int s = 0; s < spec.stages; ++s)
    for (size_t r = 0; r < plans[size_t(s)].groups.size(); ++r)
      for (const Transfer& t : plans[size_t(s)].groups[r]) {
        const int peer = t.from_stage == s ? t.to_stage : t.from_stage;
        const auto& theirs = plans[size_t(peer)].groups.at(r);
        EXPECT_NE(std::find(theirs.begin(), theirs.end(), t), theirs.end())
            << "round " << r << ": stage " << s << " posts a transfer stage " << peer
            << " does not";
      }
  // Every pass has a round, increasing along the stage's list.
  for (const RoundPlan& plan : plans)
    for (size_t i = 1; i < plan.round_of_action.size(); ++i)
      EXPECT_LT(plan.round_of_action[i - 1], plan.round_of_action[i]);
}

// The model is strict enough to see the deadlock rounds avoid.
TEST(Rounds, OnePassAheadDeadlocksUnderNcclOrdering) {
  const ScheduleSpec spec{ScheduleKind::OneFOneB, 2, 2, 1, 1};
  const auto lists = lists_of(spec);
  EXPECT_NE(
      replay(lists, spec.placement(), one_ahead_order(lists, spec.placement())).find("deadlock"),
      std::string::npos);
}

TEST(Rounds, ListsThatCannotRunAreRefused) {
  // Stage 1 runs micro-batch 1 first, stage 0 sends micro-batch 0 first: under order
  // matching (and here by data) stage 1 waits on a pass that waits on it.
  const std::vector<std::vector<Action>> lists = {{{Action::Forward, 0, 0},
                                                   {Action::Backward, 0, 0},
                                                   {Action::Forward, 1, 0},
                                                   {Action::Backward, 1, 0}},
                                                  {{Action::Forward, 1, 0},
                                                   {Action::Backward, 1, 0},
                                                   {Action::Forward, 0, 0},
                                                   {Action::Backward, 0, 0}}};
  EXPECT_ANY_THROW(plan_rounds(lists, ChunkPlacement{2, 1, false}, 0));
}

}  // namespace
}  // namespace pentad::parallel::pp
