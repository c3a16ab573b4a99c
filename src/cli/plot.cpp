// `pentad plot` (cli/plot.h): checks the run directories and runs scripts/plot_curves.py.
#include "cli/plot.h"

#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cli/command.h"
#include "core/check.h"

extern char** environ;

namespace pentad {

std::string plot_script_path() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed =
        exe.parent_path() / ".." / "share" / "pentad" / "plot_curves.py";
    if (std::filesystem::is_regular_file(installed, ec)) return installed.lexically_normal();
  }
  return PENTAD_PLOT_SCRIPT;
}

std::string plot_python() {
  if (const char* python = std::getenv("PENTAD_PYTHON"); python && *python) return python;
  std::error_code ec;
  return std::filesystem::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
}

int plot_curves(const std::vector<std::string>& run_dirs, const std::string& out_png) {
  namespace fs = std::filesystem;
  for (const std::string& dir : run_dirs) {
    if (!fs::is_directory(dir))
      fail("pentad plot: {} is not a directory: give run directories (each run's train.out_dir)",
           dir);
    if (!fs::is_regular_file(fs::path(dir) / "metrics.jsonl"))
      fail(
          "pentad plot: {} has no metrics.jsonl: give the train.out_dir of a run that has trained "
          "at least one step",
          dir);
  }
  const std::string script = plot_script_path();
  if (!fs::is_regular_file(script))
    fail(
        "pentad plot: the plotting script {} is missing: run pentad from its build tree (the "
        "source's scripts/) or install it (cmake --install puts it in share/pentad/)",
        script);
  const std::string python = plot_python();
  std::vector<std::string> args = {python, script, "-o", out_png};
  args.insert(args.end(), run_dirs.begin(), run_dirs.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  if (const int error =
          posix_spawnp(&child, python.c_str(), nullptr, nullptr, argv.data(), environ))
    fail(
        "pentad plot: cannot run {} ({}): install Python 3 and matplotlib (Debian: apt-get "
        "install python3-matplotlib), or name a python that has it in PENTAD_PYTHON",
        python, std::strerror(error));
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    fail("pentad plot: {} {} died of signal {}", python, script, WTERMSIG(status));
  return WEXITSTATUS(status);
}

}  // namespace pentad

namespace pentad::cli {
namespace {

// The plot subcommand's options, for `pentad plot` itself and for `pentad --help`.
void add_plot_options(CLI::App* plot, std::vector<std::string>& run_dirs, std::string& out) {
  plot->add_option("run_dirs", run_dirs, "Run directories (train.out_dir), one colour each")
      ->required();
  plot->add_option("-o,--out", out, "PNG file to write")->required();
}

// `pentad plot`: a Python script draws the figure, so no MPI starts (a child process of an
// MPI singleton is one Open MPI warns about).
int plot_main(int argc, char** argv) {
  CLI::App app{
      "pentad plot: training curves of runs (loss and eval loss, learning rate, "
      "tokens/s, gradient norm against the step)",
      "pentad plot"};
  std::vector<std::string> run_dirs;
  std::string out;
  add_plot_options(&app, run_dirs, out);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kRefused;
  }
  try {
    return plot_curves(run_dirs, out);
  } catch (const Error& e) {
    print_error(e, -1);
    return kRefused;
  }
}

}  // namespace

void add_plot_command(Commands& commands) {
  // For --help alone: `pentad plot` runs plot_main before MPI starts.
  auto& run_dirs = commands.keep<std::vector<std::string>>();
  auto& out = commands.keep<std::string>();
  CLI::App* plot = commands.app().add_subcommand(
      "plot",
      "Draw runs' training curves into a PNG: pentad plot RUN_DIR [RUN_DIR ...] -o curves.png "
      "(matplotlib)");
  add_plot_options(plot, run_dirs, out);
  commands.add_standalone(plot, plot_main);
}

}  // namespace pentad::cli
