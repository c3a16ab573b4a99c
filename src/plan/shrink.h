#pragma once
// After ranks are lost: the best layout for the ranks that remain (`pentad launch --replan`,
// `pentad plan --after-loss K`), against the simplest answer, one data-parallel replica fewer
// (`--exclude-culprit`). Both keep the job's global batch.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan_search.h"

namespace pentad {

// The planner's machine and memory limit per rank for a count of ranks.
struct PlanTarget {
  Machine machine;
  parallel::Topology topology;
  double memory_limit_bytes = 0;
};
using TargetFor = std::function<PlanTarget(int ranks)>;

// The target `pentad plan` plans `ranks` ranks for: the `cluster` preset, or this machine by
// the calibration at `calibration_path` (its memory shared by the ranks); the memory limit
// `memory_gb` where positive, else train.memory_limit_mb where set, else the machine's.
PlanTarget plan_target(const std::string& cluster, const std::string& calibration_path,
                       const Config& cfg, int ranks, double memory_gb = 0);

// The counts a shrink searches: every count up to 64 remaining; above, the 5 counts from
// `remaining` down, the largest multiple of each power of two up to a quarter of it, and the
// counts 2^a 3^b from a quarter of it up (about 25 searches at a thousand ranks).
std::vector<int> shrink_counts(int remaining);

struct ShrinkPlan {
  std::optional<PlanRow> best;  // the fastest predicted step over the counts searched
  int ranks = 0;                // its rank count
  std::string refusal;          // when none: the planner's reason, memory's where it applies
};
// `recipe` with train.global_batch set to the job's: the fastest layout on at most
// `remaining` ranks.
ShrinkPlan best_after_loss(const Config& recipe, int remaining, const TargetFor& target);
// The same on exactly `ranks` ranks (growing back to the full count).
ShrinkPlan best_on(const Config& recipe, int ranks, const TargetFor& target);

// One data-parallel replica fewer (`recipe` with train.global_batch set to the job's): the job's
// layout (`fixed`, parse_layout's fields, dp among them) at dp - 1 on ranks - ranks / dp, the
// global batch kept where grad_accum can make it up, else shrunk to micro_batch x grad_accum x (dp
// - 1), as --exclude-culprit does. Nothing where dp is 1 or the planner refuses it (`refusal` says
// why).
std::optional<PlanRow> one_replica_fewer(const Config& recipe, int ranks,
                                         std::map<std::string, std::string> fixed,
                                         const TargetFor& target, std::string* refusal);

// `layout` as parse_layout's fields, every one fixed.
std::map<std::string, std::string> layout_as_fields(const Layout& layout);

// `pentad plan --ranks N --after-loss K`: the recipe's best layout on N ranks (or the one
// --layout fixes), then after K ranks are lost one replica fewer and the re-planned layout,
// each with its predicted step and throughput; as a table, or JSON.
std::string describe_after_loss(const Config& recipe, int ranks, int lost,
                                const std::map<std::string, std::string>& fixed,
                                const TargetFor& target, bool json);

}  // namespace pentad
