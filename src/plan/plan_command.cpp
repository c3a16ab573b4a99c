// `pentad plan` (plan/plan_command.h).
#include "plan/plan_command.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>

#include "core/check.h"
#include "plan/calibration.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "plan/plan_search.h"
#include "plan/shrink.h"
#include "recipe/recipe.h"

namespace pentad {
namespace {

// Whether `path` holds this machine's table timed on quieter cores than `fresh`'s: a busy
// machine's new table then does not replace it.
bool keeps_quieter(const Calibration& fresh, const std::string& path) {
  if (!std::filesystem::exists(path)) return false;
  try {
    const Calibration old = Calibration::read(path);
    return old.machine == fresh.machine && old.cores == fresh.cores &&
           old.others_share() < fresh.others_share();
  } catch (const Error&) {
    return false;  // unreadable: replaced
  }
}

// While alive, the log goes to stderr: `--json` leaves stdout to the JSON, so that a warning
// (a calibration of another machine, ...) still shows without breaking what reads it.
class LogToStderr {
 public:
  LogToStderr() : saved_(spdlog::default_logger()) {
    auto err = std::make_shared<spdlog::logger>(
        kName, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    spdlog::initialize_logger(err);  // the pattern and level set for every logger
    spdlog::set_default_logger(err);
  }
  ~LogToStderr() {
    spdlog::set_default_logger(saved_);
    spdlog::drop(kName);
  }
  LogToStderr(const LogToStderr&) = delete;
  LogToStderr& operator=(const LogToStderr&) = delete;

 private:
  static constexpr const char* kName = "pentad-stderr";
  std::shared_ptr<spdlog::logger> saved_;
};

}  // namespace

void plan_command(const PlanArgs& a, bool print) {
  auto out = [&](const std::string& s) {
    if (print) std::fputs(s.c_str(), stdout);
  };
  std::optional<LogToStderr> log_to_stderr;
  if (a.json) log_to_stderr.emplace();
  const std::string calibration_path =
      a.calibration.empty() ? default_calibration_path() : a.calibration;
  if (a.calibrate) {
    const Calibration c = calibrate(print);
    if (c.others_share() > kMaxOthersShare && keeps_quieter(c, calibration_path)) {
      spdlog::warn(
          "calibration: other processes used {:.0f}% of the cores while it timed; {} (this "
          "machine's, timed on quieter cores) is kept",
          100 * c.others_share(), calibration_path);
    } else {
      c.write(calibration_path);
      out(fmt::format("calibration of {} ({} cores) written to {}\n", c.machine, c.cores,
                      calibration_path));
      if (c.others_share() > kMaxOthersShare) warn_busy(c, calibration_path);
    }
    if (a.recipe.empty()) return;
  }
  if (a.recipe.empty()) fail("pentad plan needs a recipe (or --calibrate alone)");
  Config cfg = load_recipe(a.recipe, a.overrides);
  const bool search = a.ranks > 0;
  if (!search) {
    for (const auto& [set, name] : {std::pair{!a.topology.empty(), "--topology"},
                                    {!a.cluster.empty(), "--cluster"},
                                    {!a.layout.empty(), "--layout"},
                                    {a.engine != "pentad", "--engine"},
                                    {!a.write.empty(), "--write"},
                                    {a.json, "--json"}})
      if (set) fail("{} needs --ranks N: the layout search is over N ranks", name);
    const ParallelConfig& p = cfg.parallel;
    // dp 0: the fewest data-parallel ranks over which the experts split (ep x etp).
    const int64_t dp = p.dp > 0 ? p.dp : p.ep * p.etp / std::gcd(p.ep * p.etp, p.cp * p.tp);
    const parallel::MeshConfig layout = mesh_config(cfg, int(dp * p.tp * p.cp * p.pp));
    // model.recompute = "auto" decides against train.memory_limit_mb when set; without it
    // the plan shows recompute off (a run decides against its own machine's memory).
    if (cfg.train.memory_limit_mb > 0) {
      const std::string note = resolve_recompute(cfg, layout, NodeShare{});
      if (!note.empty()) out(note + "\n");
    }
    out(describe_memory(cfg, layout) + "\n");
    // Against train.memory_limit_mb when set (this machine's memory says nothing of the
    // machines planned for).
    if (cfg.train.memory_limit_mb > 0) check_memory(cfg, layout, NodeShare{});
    return;
  }
  if (a.ranks > (1 << 20)) fail("--ranks {}: at most {} ranks", a.ranks, 1 << 20);
  const int ranks = int(a.ranks);
  if (a.memory_gb < 0) fail("--memory-gb {}: must be positive", a.memory_gb);
  PlanTarget target = plan_target(a.cluster, calibration_path, cfg, ranks, a.memory_gb);
  target.machine.engine = engine_named(a.engine);
  if (a.engine != "pentad" && !target.machine.gpu)
    fail("--engine {}: predicts another trainer on a GPU cluster; add --cluster", a.engine);
  if (!a.topology.empty()) {
    target.topology = parallel::Topology::read(a.topology);
    target.topology.check_ranks(ranks, a.topology);
  }
  if (a.top < 1) fail("--top {}: must be at least 1", a.top);
  if (a.after_loss != 0) {
    auto target_for = [&](int n) {
      if (n == ranks) return target;
      PlanTarget t = plan_target(a.cluster, calibration_path, cfg, n, a.memory_gb);
      t.machine.engine = target.machine.engine;
      return t;
    };
    out(describe_after_loss(cfg, ranks, a.after_loss, parse_layout(a.layout, ranks), target_for,
                            a.json));
    return;
  }
  const PlanSearch plan =
      search_layouts(cfg, ranks, parse_layout(a.layout, ranks), target.memory_limit_bytes,
                     target.machine, target.topology);
  Config best = cfg;
  plan.rows.front().layout.apply(best);
  if (a.json) {
    out(plan_json(plan, target.machine) + "\n");
  } else {
    out(describe_plan(plan, target.machine, a.top));
    out(describe_memory(best, mesh_config(best, ranks)) + "\n");
  }
  if (!a.write.empty()) {
    std::ofstream f(a.write);
    if (!f) fail("--write {}: cannot open the file for writing", a.write);
    f << recipe_to_toml(best);
    if (!f) fail("--write {}: write failed", a.write);
    if (!a.json) out(fmt::format("recipe with the best layout written to {}\n", a.write));
  }
}

}  // namespace pentad
