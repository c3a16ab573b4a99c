#include "launch/replan.h"

#include <fmt/format.h>

#include <limits>
#include <map>

#include "core/check.h"
#include "launch/job_command.h"
#include "plan/calibration.h"
#include "plan/memory_budget.h"
#include "plan/plan_search.h"
#include "recipe/recipe.h"

namespace pentad::launch {

namespace {

using nlohmann::json;

// The planner's machine and memory limit per rank for `ranks` ranks.
struct Target {
  Cluster cluster;
  double memory_limit = 0;
};

Target target_for(const ReplanMachine& m, const Config& cfg, int ranks) {
  Target t;
  if (!m.cluster.empty()) {
    t.cluster = cluster_preset(m.cluster, ranks);
  } else {
    t.cluster = this_machine(Calibration::read(m.calibration_path), ranks);
    t.cluster.machine.memory_bytes = node_share().memory_bytes / ranks;
  }
  t.memory_limit = cfg.train.memory_limit_mb > 0 ? double(cfg.train.memory_limit_mb) * 1048576.0
                                                 : t.cluster.machine.memory_bytes;
  return t;
}

// The job's own layout as --layout fields, for the old layout's prediction on the old ranks:
// the degrees and batch the ranks reported, the rest from the recipe they ran.
std::map<std::string, std::string> fields_of(const json& layout, const Config& cfg) {
  std::map<std::string, std::string> fixed;
  for (const auto& [axis, field] : {std::pair{"tp", "tp"},
                                    {"cp", "cp"},
                                    {"pp", "pp"},
                                    {"dp", "dp"},
                                    {"ep", "ep"},
                                    {"etp", "etp"},
                                    {"micro_batch", "mb"},
                                    {"grad_accum", "ga"}})
    if (layout.contains(axis)) fixed[field] = std::to_string(layout.value(axis, int64_t{1}));
  const ParallelConfig& p = cfg.parallel;
  if (!p.tp_shape.empty() && p.tp_shape != "auto") fixed["tp_shape"] = p.tp_shape;
  fixed["sp"] = p.sequence_parallel ? "true" : "false";
  fixed["zero"] = std::to_string(p.zero);
  fixed["offload"] = p.offload;
  fixed["recompute"] = cfg.model.recompute ? "true" : "false";
  fixed["schedule"] = p.pp_schedule;
  fixed["vp"] = std::to_string(p.virtual_stages);
  fixed["cp_impl"] = p.cp_impl;
  return fixed;
}

}  // namespace

Replan replan_after_loss(const std::vector<std::string>& command, const json& layout, int world,
                         int lost, const ReplanMachine& machine, std::string* why) {
  Replan r;
  const size_t train_at = pentad_train_at(command);
  const RankCount count = find_rank_count(command, train_at);
  if (train_at + 1 >= command.size() || count.at == 0) {
    *why =
        "the job command has no launcher rank count (-np N, -n N or srun's --ntasks=N before "
        "`pentad train RECIPE`) to rewrite";
    return r;
  }
  if (!layout.is_object() || !layout.contains("dp") || !layout.contains("micro_batch")) {
    *why = "the ranks did not report their layout (a pentad without it in its hello?)";
    return r;
  }
  r.ranks_before = world;
  const int remaining = world - lost;
  if (remaining < 1) {
    *why = fmt::format("the fault took all {} ranks", world);
    return r;
  }
  r.global_batch = layout.value("micro_batch", int64_t{1}) *
                   layout.value("grad_accum", int64_t{1}) * layout.value("dp", int64_t{1});
  try {
    Config cfg = load_recipe(command[train_at + 1], recipe_overrides(command, train_at));
    cfg.train.global_batch = r.global_batch;
    cfg.parallel.topology.clear();
    {
      const Target old = target_for(machine, cfg, world);
      const PlanSearch before = search_layouts(cfg, world, fields_of(layout, cfg), old.memory_limit,
                                               old.cluster.machine, old.cluster.topology);
      r.predicted_before_s = before.rows.front().prediction.step_seconds;
      r.layout_before = before.rows.front().layout.label();
    }
  } catch (const Error&) {
    // The old layout as the planner sees it is for the log only.
  }
  // The refusal to quote: where layouts passed the checks but memory held none (it says what
  // would fit), else the one for the most ranks.
  std::string first_refusal, memory_refusal;
  const PlanRow* best = nullptr;
  std::vector<PlanSearch> searches;
  for (int n = remaining; n >= 1; --n) {
    try {
      Config cfg = load_recipe(command[train_at + 1], recipe_overrides(command, train_at));
      cfg.train.global_batch = r.global_batch;
      cfg.parallel.topology.clear();
      const Target t = target_for(machine, cfg, n);
      searches.push_back(
          search_layouts(cfg, n, {}, t.memory_limit, t.cluster.machine, t.cluster.topology));
    } catch (const Error& e) {
      const std::string refusal = fmt::format("on {} ranks: {}", n, e.what());
      if (first_refusal.empty()) first_refusal = refusal;
      if (memory_refusal.empty() && refusal.find("memory") != std::string::npos)
        memory_refusal = refusal;
    }
  }
  double fastest = std::numeric_limits<double>::max();
  int best_ranks = 0;
  for (const PlanSearch& s : searches) {
    const PlanRow& row = s.rows.front();
    const int n = int(row.layout.tp * row.layout.cp * row.layout.pp * row.layout.dp);
    if (row.prediction.step_seconds < fastest) {
      fastest = row.prediction.step_seconds;
      best = &row;
      best_ranks = n;
    }
  }
  if (!best) {
    *why = fmt::format("no layout of 1 to {} ranks keeps the global batch of {} sequences ({})",
                       remaining, r.global_batch,
                       memory_refusal.empty() ? first_refusal : memory_refusal);
    return r;
  }
  r.ranks_after = best_ranks;
  r.layout_after = best->layout.label();
  r.predicted_after_s = best->prediction.step_seconds;
  r.command = command;
  r.command[count.at] = count.prefix + std::to_string(best_ranks);
  std::vector<std::string> sets = best->layout.overrides();
  sets.push_back(fmt::format("train.global_batch={}", r.global_batch));
  sets.push_back("parallel.topology=\"\"");
  for (const std::string& s : sets) {
    drop_override(r.command, s.substr(0, s.find('=')), train_at);
    r.command.insert(r.command.end(), {"--set", s});
  }
  r.note = fmt::format(
      "re-planned for the {} ranks that remain: {} on {} ranks -> {} on {} ranks, global batch "
      "{} sequences kept; predicted step {:.3g} s -> {:.3g} s",
      remaining, r.layout_before.empty() ? std::string("the old layout") : r.layout_before, world,
      r.layout_after, best_ranks, r.global_batch, r.predicted_before_s, r.predicted_after_s);
  return r;
}

}  // namespace pentad::launch
