#pragma once
// `pentad launch --exclude-culprit`: the restarted job runs with one data-parallel replica
// fewer. Checkpoints reshard to any layout, so the new job resumes the old one's state.
//
// The rewrite, from the layout the ranks reported in their hello ("layout": the mesh
// degrees, micro_batch and grad_accum) and the world size:
//   - the launcher's rank count (-np N, -n N, --np N, --n N, -c N before the pentad
//     command) drops by one replica, world / dp ranks;
//   - `--set parallel.dp=<dp-1>` goes to the pentad command;
//   - the global batch (micro_batch x grad_accum x dp sequences) stays when grad_accum x dp
//     divides by dp - 1 (`--set train.grad_accum=` that quotient), else it shrinks to
//     micro_batch x grad_accum x (dp - 1), which the result says.
// On one machine every rank shares it, so "excluding" the culprit means fewer ranks, not
// other hardware: the replica that goes is whichever the launcher no longer starts.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pentad::launch {

struct Exclusion {
  std::vector<std::string> command;  // the rewritten job command
  int dp_before = 0, dp_after = 0, ranks_before = 0, ranks_after = 0;
  int64_t global_batch_before = 0, global_batch_after = 0;  // sequences per step
  std::string note;  // one line for the log: what changed and why
};

// The command with one replica fewer, or an empty command with `why` saying what stands in
// the way (dp 1, no rank count found, a layout the ranks did not report, MoE experts that
// would not divide over the smaller group).
Exclusion exclude_one_replica(const std::vector<std::string>& command, const nlohmann::json& layout,
                              int world, std::string* why);

}  // namespace pentad::launch
