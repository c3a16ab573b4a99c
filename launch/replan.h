#pragma once
// `pentad launch --replan`: after a fault that took ranks away, the best layout for the ranks
// that remain. The planner (plan/shrink.h over plan/plan_search.h: the same search and cost
// model as `pentad plan`) searches every layout of n ranks, for the counts from what remains
// down that shrink_counts lists, keeping the job's global batch (micro_batch x grad_accum x dp, as
// the ranks reported it); the fastest predicted step wins, and the job command is rewritten for it:
// the launcher's rank count, and `--set` for every layout key, train.global_batch, and
// parallel.topology emptied (a topology file holds the links of the old rank count). Checkpoints
// reshard on load, and the data order continues sample for sample at the same global batch.
//
// On one machine the ranks that "remain" share its cores with nothing freed: the planner's
// choice is what would be best on the machine the recipe plans for (--cluster), or on this
// one by its calibration.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/topology.h"

namespace pentad::launch {

struct Replan {
  std::vector<std::string> command;  // the rewritten job command (empty: refused, see why)
  int ranks_before = 0, ranks_after = 0;
  std::string layout_before, layout_after;  // plan/plan_search.h's labels
  double predicted_before_s = 0;            // the old layout's step on the old ranks (0: none)
  double predicted_after_s = 0;
  int64_t global_batch = 0;  // sequences per step, before and after
  int64_t steps = 0;         // where the job stops: train.steps (train.stop_at if sooner)
  std::string note;          // one line for the log
};

// Where the planner's machine comes from: a cluster preset (--cluster, as `pentad plan`), or
// this machine's calibration file (plan/calibration.h).
struct ReplanMachine {
  std::string cluster;
  std::string calibration_path;
};

// The command re-planned for `world - lost` ranks from the job's reported `layout` (the
// hello's). `why` says what stands in the way when it returns an empty command: no rank count
// to rewrite, a recipe that does not load, no layout of any count that the recipe's checks
// accept and memory holds (with the planner's reason).
Replan replan_after_loss(const std::vector<std::string>& command, const nlohmann::json& layout,
                         int world, int lost, const ReplanMachine& machine, std::string* why);

// Growing back: the command re-planned for exactly `ranks` ranks (the job's full count, its
// lost ranks back), at the global batch the `layout` reported.
Replan replan_to(const std::vector<std::string>& command, const nlohmann::json& layout, int world,
                 int ranks, const ReplanMachine& machine, std::string* why);

// Around a slow link: every layout of the same `world` ranks planned with `links` slowed as
// measured (the planner's topology with each `factor` times slower: one pair, or every pair
// between two hosts); the job's own layout is predicted on that topology too
// (predicted_before_s). layout_after equal to layout_before: the job already runs the best.
Replan replan_around(const std::vector<std::string>& command, const nlohmann::json& layout,
                     int world, const std::vector<parallel::SlowLink>& links,
                     const ReplanMachine& machine, std::string* why);

}  // namespace pentad::launch
