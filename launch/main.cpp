// pentad: the command line. Each subcommand registers itself, its options and its action,
// from the file that owns it (cli/command.h; launch/commands.h for train, reference and
// launch); main starts MPI, parses and runs the one parsed. Each rank of a job starts here:
// MPI, then (for train) launch/rank.h's threads and device, the mesh and the Trainer.
// `pentad launch` (launch/supervisor.h) and `pentad plot` (cli/plot.h) are no ranks and
// start first.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/command.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/door.h"
#include "launch/commands.h"
#include "launch/errors.h"
#include "launch/rank.h"

namespace {

// `pentad --version`: the release (CMake's project version) and the backends compiled in.
std::string pentad_version() {
  return fmt::format("pentad {} (backends: cpu{})", PENTAD_VERSION,
                     pentad::kernels::kCudaBuilt ? ", cuda" : "");
}

// Every subcommand, in the order of `pentad --help`.
void add_commands(pentad::cli::Commands& commands) {
  pentad::launch::add_launch_command(commands);
  pentad::cli::add_plot_command(commands);
  pentad::launch::add_train_command(commands);
  pentad::launch::add_reference_command(commands);
  pentad::cli::add_plan_command(commands);
  pentad::cli::add_probe_command(commands);
  pentad::cli::add_recipe_commands(commands);
  pentad::cli::add_data_commands(commands);
  pentad::cli::add_tokenizer_commands(commands);
  pentad::cli::add_ckpt_commands(commands);
  pentad::cli::add_generate_command(commands);
}

}  // namespace

int main(int argc, char** argv) {
  // First: it may start this program again, which must happen before MPI or any thread.
  pentad::kernels::cpu::restart_with_better_blas_core(argv);
  using pentad::cli::kInternal, pentad::cli::kRefused;
  CLI::App app{"pentad: 5D-parallel trainer for GPT and MoE language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", pentad_version(), "Print pentad's version and backends");
  pentad::cli::Commands commands(app);
  add_commands(commands);
  if (const pentad::cli::Standalone standalone = commands.standalone(argc, argv))
    return standalone(argc - 1, argv + 1);
  // Before MPI_Init, which would abort here with a message that names no cause. Every task
  // gets the same environment but one, SLURM_PROCID 0, says why.
  if (const std::string why = pentad::launch::mpi_start_refusal(std::getenv); !why.empty()) {
    const char* task = std::getenv("SLURM_PROCID");
    if (!task || std::string(task) == "0") std::fprintf(stderr, "pentad: error: %s\n", why.c_str());
    return kRefused;
  }
  pentad::launch::prepare_singleton_start();
  pentad::launch::Mpi mpi(argc, argv);
  spdlog::set_pattern(fmt::format("%H:%M:%S [rank {}] %v", mpi.rank));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own statuses (105 a failed check, 106 a missing argument, ...) would be the only
    // usage errors not to exit 2; --help and --version exit 0.
    const int status = mpi.rank == 0 ? app.exit(e) : e.get_exit_code();
    return status == 0 ? 0 : kRefused;
  }
  const pentad::cli::Job job = mpi.job();
  try {
    return commands.run(job);
  } catch (const std::exception& e) {
    return pentad::launch::report_error(e, pentad::cli::is_ours(e) ? kRefused : kInternal, job);
  }
}
