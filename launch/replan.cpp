#include "launch/replan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/check.h"
#include "launch/job_command.h"
#include "plan/plan_search.h"
#include "plan/shrink.h"
#include "recipe/recipe.h"

namespace pentad::launch {

namespace {

using nlohmann::json;

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
  // "auto": the search chooses, as a run decides from the memory plan.
  if (!cfg.model.recompute.automatic) fixed["recompute"] = cfg.model.recompute ? "true" : "false";
  fixed["schedule"] = p.pp_schedule;
  fixed["vp"] = std::to_string(p.virtual_stages);
  fixed["cp_impl"] = p.cp_impl;
  return fixed;
}

// All three: `grow_to` 0 re-plans for at most world - lost ranks, else for exactly grow_to;
// `slow`: links of the planner's topology to slow.
Replan replan(const std::vector<std::string>& command, const json& layout, int world, int lost,
              int grow_to, const std::vector<parallel::SlowLink>& slow,
              const ReplanMachine& machine, std::string* why) {
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
  Config cfg;
  try {
    cfg = load_recipe(command[train_at + 1], recipe_overrides(command, train_at));
  } catch (const Error& e) {
    *why = e.what();
    return r;
  }
  r.steps = cfg.train.stop_at > 0 ? std::min(cfg.train.stop_at, cfg.train.steps) : cfg.train.steps;
  cfg.train.global_batch = r.global_batch;
  cfg.parallel.topology.clear();
  auto target = [&](int n) {
    PlanTarget t = plan_target(machine.cluster, machine.calibration_path, cfg, n);
    for (const parallel::SlowLink& l : slow)
      if (std::max(l.a, l.b) < t.topology.ranks) t.topology.slow_link(l.a, l.b, l.factor);
    return t;
  };
  try {  // the old layout as the planner sees it (around a slow link: what the gain is against)
    const PlanTarget old = target(world);
    const PlanRow before = search_layouts(cfg, world, fields_of(layout, cfg),
                                          old.memory_limit_bytes, old.machine, old.topology)
                               .rows.front();
    r.predicted_before_s = before.prediction.step_seconds;
    r.layout_before = before.layout.label();
  } catch (const Error& e) {
    if (!slow.empty()) {
      *why = fmt::format("the job's own layout could not be predicted ({})", e.what());
      return r;
    }
  }
  const ShrinkPlan shrink =
      grow_to > 0 ? best_on(cfg, grow_to, target) : best_after_loss(cfg, remaining, target);
  if (!shrink.best) {
    *why = fmt::format("no layout of {} ranks keeps the global batch of {} sequences ({})",
                       grow_to > 0 ? std::to_string(grow_to) : fmt::format("1 to {}", remaining),
                       r.global_batch, shrink.refusal);
    return r;
  }
  const PlanRow* best = &*shrink.best;
  const int best_ranks = shrink.ranks;
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
  std::string what = grow_to > 0 ? fmt::format("all {} ranks, back", grow_to)
                                 : fmt::format("the {} ranks that remain", remaining);
  if (slow.size() == 1)
    what = fmt::format("link {}-{} {:.3g}x slower", slow[0].a, slow[0].b, slow[0].factor);
  else if (!slow.empty())
    what = fmt::format("{} links {:.3g}x slower", slow.size(), slow[0].factor);
  r.note = fmt::format(
      "re-planned for {}: {} on {} ranks -> {} on {} ranks, global batch {} sequences kept; "
      "predicted step {:.3g} s -> {:.3g} s",
      what, r.layout_before.empty() ? std::string("the old layout") : r.layout_before, world,
      r.layout_after, best_ranks, r.global_batch, r.predicted_before_s, r.predicted_after_s);
  return r;
}

}  // namespace

Replan replan_after_loss(const std::vector<std::string>& command, const json& layout, int world,
                         int lost, const ReplanMachine& machine, std::string* why) {
  return replan(command, layout, world, lost, 0, {}, machine, why);
}

Replan replan_to(const std::vector<std::string>& command, const json& layout, int world, int ranks,
                 const ReplanMachine& machine, std::string* why) {
  return replan(command, layout, world, 0, ranks, {}, machine, why);
}

Replan replan_around(const std::vector<std::string>& command, const json& layout, int world,
                     const std::vector<parallel::SlowLink>& links, const ReplanMachine& machine,
                     std::string* why) {
  return replan(command, layout, world, 0, world, links, machine, why);
}

}  // namespace pentad::launch
