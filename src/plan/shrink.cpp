#include "plan/shrink.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "plan/calibration.h"
#include "plan/memory_budget.h"

namespace pentad {

PlanTarget plan_target(const std::string& cluster, const std::string& calibration_path,
                       const Config& cfg, int ranks, double memory_gb) {
  Cluster c;
  if (!cluster.empty()) {
    c = cluster_preset(cluster, ranks);
  } else {
    c = this_machine(Calibration::read(calibration_path), ranks);
    c.machine.memory_bytes = node_share().memory_bytes / ranks;
  }
  const double limit = memory_gb > 0 ? memory_gb * 1e9
                       : cfg.train.memory_limit_mb > 0
                           ? double(cfg.train.memory_limit_mb) * 1048576.0
                           : c.machine.memory_bytes;
  return {c.machine, c.topology, limit};
}

std::vector<int> shrink_counts(int remaining) {
  std::set<int, std::greater<>> counts;
  if (remaining <= 64) {
    for (int n = remaining; n >= 1; --n) counts.insert(n);
  } else {  // a layout on fewer than a quarter of the ranks would not be the fastest
    for (int n = remaining; n >= remaining - 4; --n) counts.insert(n);
    for (int p = 2; p <= remaining / 4; p *= 2) counts.insert(remaining / p * p);
    // 2^a 3^b: the counts a global batch of 2^a 3^b sequences (most are) divides best
    for (int64_t two = 1; two <= remaining; two *= 2)
      for (int64_t n = two; n <= remaining; n *= 3)
        if (n >= remaining / 4) counts.insert(int(n));
  }
  return {counts.begin(), counts.end()};
}

namespace {

ShrinkPlan fastest_of(const Config& recipe, const std::vector<int>& counts,
                      const TargetFor& target) {
  ShrinkPlan plan;
  std::string first_refusal, memory_refusal;
  double fastest = std::numeric_limits<double>::max();
  for (int n : counts) {
    try {
      const PlanTarget t = target(n);
      const PlanSearch s =
          search_layouts(recipe, n, {}, t.memory_limit_bytes, t.machine, t.topology);
      const PlanRow& row = s.rows.front();
      if (row.prediction.step_seconds < fastest) {
        fastest = row.prediction.step_seconds;
        plan.best = row;
        plan.ranks = n;
      }
    } catch (const Error& e) {
      const std::string refusal = fmt::format("on {} ranks: {}", n, e.what());
      if (first_refusal.empty()) first_refusal = refusal;
      if (memory_refusal.empty() && refusal.find("memory") != std::string::npos)
        memory_refusal = refusal;
    }
  }
  // Where layouts passed the checks but memory held none, that refusal says what would fit.
  if (!plan.best) plan.refusal = memory_refusal.empty() ? first_refusal : memory_refusal;
  return plan;
}

}  // namespace

ShrinkPlan best_after_loss(const Config& recipe, int remaining, const TargetFor& target) {
  return fastest_of(recipe, shrink_counts(remaining), target);
}

ShrinkPlan best_on(const Config& recipe, int ranks, const TargetFor& target) {
  return fastest_of(recipe, {ranks}, target);
}

std::optional<PlanRow> one_replica_fewer(const Config& recipe, int ranks,
                                         std::map<std::string, std::string> fixed,
                                         const TargetFor& target, std::string* refusal) {
  const int dp = fixed.count("dp") ? std::stoi(fixed["dp"]) : 1;
  if (dp <= 1) {
    *refusal = "dp 1: no replica to spare";
    return std::nullopt;
  }
  const int n = ranks - ranks / dp;
  fixed["dp"] = std::to_string(dp - 1);
  fixed.erase("ga");  // the search keeps the global batch through grad_accum where it can...
  Config shrunk = recipe;
  const int64_t round = std::stoll(fixed.at("mb")) * (dp - 1);
  if (recipe.train.global_batch % round != 0)  // ... else it shrinks, as --exclude-culprit's
    shrunk.train.global_batch = recipe.train.global_batch / std::stoll(fixed.at("mb")) / dp * round;
  try {
    const PlanTarget t = target(n);
    return search_layouts(shrunk, n, fixed, t.memory_limit_bytes, t.machine, t.topology)
        .rows.front();
  } catch (const Error& e) {
    *refusal = e.what();
    return std::nullopt;
  }
}

std::map<std::string, std::string> layout_as_fields(const Layout& l) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  return {{"tp", std::to_string(l.tp)},
          {"tp_shape", fmt::format("{}x{}", l.tp / l.d2, l.d2)},
          {"tp_order", l.tp_order},
          {"tp_chunks", std::to_string(l.tp_chunks)},
          {"sp", flag(l.sp)},
          {"cp", std::to_string(l.cp)},
          {"cp_impl", l.cp_impl},
          {"cp_ulysses", std::to_string(l.cp_ulysses)},
          {"pp", std::to_string(l.pp)},
          {"schedule", l.schedule},
          {"vp", std::to_string(l.vp)},
          {"pp_group", std::to_string(l.pp_group)},
          {"cut", l.pp_layout == "balanced" ? "balanced" : "even"},
          {"dp", std::to_string(l.dp)},
          {"mb", std::to_string(l.micro_batch)},
          {"ga", std::to_string(l.grad_accum)},
          {"ep", std::to_string(l.ep)},
          {"etp", std::to_string(l.etp)},
          {"zero", std::to_string(l.zero)},
          {"offload", l.offload},
          {"recompute", flag(l.recompute)}};
}

std::string describe_after_loss(const Config& recipe, int ranks, int lost,
                                const std::map<std::string, std::string>& fixed,
                                const TargetFor& target, bool json) {
  if (lost < 1 || lost >= ranks)
    fail("--after-loss {}: lose at least 1 and fewer than --ranks {}", lost, ranks);
  const PlanTarget t = target(ranks);
  const PlanSearch search =
      search_layouts(recipe, ranks, fixed, t.memory_limit_bytes, t.machine, t.topology);
  const PlanRow before = search.rows.front();
  Config kept = recipe;  // the global batch of the layout before, from here on
  kept.train.global_batch = int64_t(search.global_batch);
  std::string fewer_refusal;
  const std::optional<PlanRow> fewer =
      one_replica_fewer(kept, ranks, layout_as_fields(before.layout), target, &fewer_refusal);
  const ShrinkPlan replanned = best_after_loss(kept, ranks - lost, target);
  if (!replanned.best)
    fail("no layout of 1 to {} ranks keeps the global batch of {} sequences ({})", ranks - lost,
         search.global_batch, replanned.refusal);
  auto ranks_of = [](const Layout& l) { return int(l.tp * l.cp * l.pp * l.dp); };
  const double base = before.prediction.tokens_per_second;
  if (json) {
    auto row = [&](const PlanRow& r) {
      return nlohmann::ordered_json{{"layout", r.layout.label()},
                                    {"ranks", ranks_of(r.layout)},
                                    {"step_seconds", r.prediction.step_seconds},
                                    {"tokens_per_second", r.prediction.tokens_per_second}};
    };
    nlohmann::ordered_json j{
        {"ranks", ranks},
        {"lost", lost},
        {"global_batch", search.global_batch},
        {"before", row(before)},
        {"one_replica_fewer", fewer ? row(*fewer) : nullptr},
        {"one_replica_fewer_global_batch",
         fewer ? fewer->layout.micro_batch * fewer->layout.grad_accum * fewer->layout.dp : 0},
        {"replanned", row(*replanned.best)}};
    if (!fewer) j["one_replica_fewer_refused"] = fewer_refusal;
    return j.dump(1) + "\n";
  }
  std::string out = fmt::format(
      "after losing {} of {} ranks, keeping the global batch of {} sequences:\n  {:<20} {:<46} "
      "{:>6} {:>9} {:>12} {:>7}\n",
      lost, ranks, search.global_batch, "", "layout", "ranks", "step s", "tokens/s", "vs before");
  auto line = [&](const char* what, const PlanRow& r) {
    out += fmt::format("  {:<20} {:<46} {:>6} {:>9.4g} {:>12.6g} {:>7.3f}\n", what,
                       r.layout.label(), ranks_of(r.layout), r.prediction.step_seconds,
                       r.prediction.tokens_per_second, r.prediction.tokens_per_second / base);
  };
  line("before", before);
  if (fewer) {
    line("one replica fewer", *fewer);
    const int64_t shrunk = fewer->layout.micro_batch * fewer->layout.grad_accum * fewer->layout.dp;
    if (shrunk != int64_t(search.global_batch))
      out += fmt::format(
          "  {:<20} (its global batch shrinks to {} sequences: grad_accum x dp "
          "does not divide by dp - 1)\n",
          "", shrunk);
  } else
    out += fmt::format("  {:<20} refused: {}\n", "one replica fewer", fewer_refusal);
  line("re-planned", *replanned.best);
  if (fewer)
    out += fmt::format(
        "re-planned against one replica fewer: {:+.1f}% tokens/s\n",
        100 * (replanned.best->prediction.tokens_per_second / fewer->prediction.tokens_per_second -
               1));
  return out;
}

}  // namespace pentad
