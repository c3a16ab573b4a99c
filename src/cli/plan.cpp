// `pentad plan`'s options (the command itself: plan/plan_command.h).
#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "plan/plan_command.h"
#include "plan/plan_search.h"

namespace pentad::cli {

void add_plan_command(Commands& commands) {
  auto& args = commands.keep<PlanArgs>();
  auto& extra = commands.keep<std::vector<std::string>>();  // trailing key=value overrides
  CLI::App* plan = commands.app().add_subcommand(
      "plan",
      "Check a recipe and print the memory each rank would need, allocating nothing; with "
      "--ranks N, search every layout of N ranks and rank them by predicted step time "
      "(docs/plan.md)");
  plan->add_option("recipe", args.recipe, "Recipe file")->check(CLI::ExistingFile);
  plan->add_option("--ranks", args.ranks,
                   "Search the layouts of this many ranks (predicted step time, tokens/s, MFU, "
                   "memory per rank)");
  plan->add_option("--topology", args.topology,
                   "The links: a `pentad probe` file for these ranks (default: the cluster "
                   "preset's, or this machine's)");
  plan->add_option("--cluster", args.cluster,
                   "A GPU cluster preset: dgx-a100 or dgx-h100, optionally :NODES (default: this "
                   "CPU machine, from its calibration)");
  plan->add_option("--engine", args.engine,
                   "Whose implementation to predict: pentad, or megatron-core (its overlaps, to "
                   "compare with its published figures; needs --cluster)")
      ->capture_default_str();
  plan->add_option("--memory-gb", args.memory_gb,
                   "Memory per rank, GB (default: train.memory_limit_mb, else the GPU's, else this "
                   "machine's share)");
  plan->add_option("--top", args.top, "Rows of the ranked table")->capture_default_str();
  plan->add_flag("--json", args.json, "Every layout that fits, ranked, as JSON");
  plan->add_option("--write", args.write, "Write the recipe with the best layout here (TOML)");
  plan->add_option("--layout", args.layout,
                   "Fix these fields and search the rest, e.g. \"tp=8,pp=4,dp=32,vp=2,mb=1\" "
                   "(fields: " +
                       layout_fields() + ")");
  plan->add_option("--after-loss", args.after_loss,
                   "With --ranks N: the best layout, then after losing this many ranks one "
                   "data-parallel replica fewer against the best layout for the ranks that "
                   "remain (what pentad launch --replan restarts on)");
  plan->add_flag("--calibrate", args.calibrate,
                 "Time this machine's kernels and write the table the CPU cost model reads");
  plan->add_option("--calibration", args.calibration,
                   "The kernel table (default: $PENTAD_CALIBRATION, else "
                   "~/.cache/pentad/calibration.json)");
  // --set first, then the trailing words: args.overrides holds both, in that order.
  plan->add_option("-s,--set", args.overrides, "Override a recipe key (repeatable)");
  plan->add_option("overrides", extra, "More section.key=value overrides");
  commands.add(plan, [&args, &extra](const Job& job) {
    args.overrides.insert(args.overrides.end(), extra.begin(), extra.end());
    plan_command(args, job.rank == 0);
    return 0;
  });
}

}  // namespace pentad::cli
