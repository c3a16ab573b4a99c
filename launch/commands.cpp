// `pentad launch` (its listing) and `pentad reference` (launch/commands.h).
#include "launch/commands.h"

#include <CLI/CLI.hpp>

#include "launch/rank.h"
#include "launch/supervisor.h"
#include "recipe/recipe.h"
#include "train/reference.h"

namespace pentad::launch {

void add_launch_command(cli::Commands& commands) {
  // The supervisor is no MPI process: an MPI_Init would leak OMPI_* into the job it starts.
  // Its options are its own (pentad launch --help); here it is listed for `pentad --help`.
  CLI::App* launch =
      commands.app()
          .add_subcommand("launch",
                          "Supervise a job: pentad launch [OPTIONS] -- mpirun ... pentad train "
                          "...; names a dead, hung or slow rank and restarts from the last "
                          "checkpoint (pentad launch --help)")
          ->allow_extras();
  commands.add_standalone(launch, supervise_main);
}

void add_reference_command(cli::Commands& commands) {
  struct Options {
    std::string recipe, out, checkpoint;
    int64_t steps = 10;
    std::vector<std::string> sets;
  };
  auto& o = commands.keep<Options>();
  CLI::App* reference = commands.app().add_subcommand(
      "reference",
      "Developer: dump weights, batches, logits, gradients and losses for the PyTorch tests");
  reference->add_option("recipe", o.recipe, "Recipe file")->required()->check(CLI::ExistingFile);
  reference->add_option("-o,--out", o.out, "Output directory")->required();
  reference->add_option("--steps", o.steps, "AdamW steps to record")->capture_default_str();
  reference->add_option("--checkpoint", o.checkpoint,
                        "Start from this checkpoint directory's weights, not the initialisation");
  reference->add_option("-s,--set", o.sets, "Override a recipe key (repeatable)");
  commands.add(reference, [&o](const cli::Job&) {
    Config cfg = load_recipe(o.recipe, o.sets);
    start_rank(cfg);
    export_reference(cfg, o.out, o.steps, o.checkpoint);
    return 0;
  });
}

}  // namespace pentad::launch
