#pragma once
// Transfer rounds: the order in which the pipeline posts transfers of device tensors.
//
// Why. NCCL runs a communicator's operations on its stream in the order they were posted,
// and matches a send to a receive by that order (there are no tags); a receive blocks every
// later operation of its stream until its peer's send runs. The executor's order for host
// tensors (each receive posted one pass ahead, each send right after its pass) relies on
// MPI's tags and independent progress. In NCCL's order it can deadlock: 1F1B on 2 stages,
// 2 micro-batches, stage 0 posts [send F0, recv B0, send F1, recv B1] and stage 1
// [recv F0, recv F1, send B0, send B1]: stage 0's recv B0 waits for stage 1's send B0, which
// waits behind its recv F1, which waits for stage 0's send F1, behind recv B0.
//
// What. Replay the schedule with every stage running at most one pass per round, a pass as
// soon as its input was produced in an earlier round (and its stage's earlier passes ran);
// each transfer belongs to the round of the pass that produces it. After its pass of round
// r (or in its place, when idle) every stage posts one group (ncclGroupStart/End: its ops
// progress together) holding its transfers of round r: the send its pass produced and the
// receives of what its neighbours produced for it. Both ends post a transfer in the same
// round and every stage posts its groups in increasing rounds, so (by induction on rounds)
// each group finds its peers' groups of that round at the heads of their streams, behind
// only earlier rounds, and completes. The passes a group waits for (the compute issued
// before it) need only transfers of earlier rounds.
#include <vector>

#include "parallel/pp/schedule.h"

namespace pentad::parallel::pp {

// A transfer between virtual stages: the forward activation of `micro` into virtual stage
// to_virtual_stage, or the gradient of its output (Backward, sent by a backward or a B) into it.
struct Transfer {
  Action::Type type = Action::Forward;
  int micro = 0;
  int to_virtual_stage = 0;
  int from_stage = 0, to_stage = 0;
  bool operator==(const Transfer&) const = default;
};

struct RoundPlan {
  std::vector<int> round_of_action;           // per action of the stage's list, its round
  std::vector<std::vector<Transfer>> groups;  // per round, this stage's transfers in it
};

// The plan of `stage` when stage s runs lists[s] (lists.size() == placement.stages; every
// stage's list comes from the same schedule, or evaluation's forward-only lists). A W takes
// a round as any pass does and moves nothing. PENTAD_CHECK fails if the lists cannot all run (a
// pass waits on one that never runs).
RoundPlan plan_rounds(const std::vector<std::vector<Action>>& lists,
                      const ChunkPlacement& placement, int stage);

}  // namespace pentad::parallel::pp
