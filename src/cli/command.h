#pragma once
// The command line's registry. Each subcommand adds itself to `pentad`'s CLI11 app from the
// file that owns its action (add_*_command below, and launch/commands.h for those that start
// ranks), with its options and the action to run once it is parsed; launch/main.cpp calls
// them in the order of `pentad --help`, parses, and runs the parsed subcommand's action.
#include <mpi.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace pentad::cli {

// Exit statuses. A refusal (2) is an error every attempt would meet again: the recipe, a
// file or directory, the layout or the memory cannot run as given, found before the first
// step (or a usage error); `pentad launch` ends the job on it instead of restarting. A failure
// (1) comes during training (restartable); an internal error (3) is pentad's own bug.
constexpr int kFailed = 1, kRefused = 2, kInternal = 3;

// Whether `e` is one of pentad's errors (pentad::Error: a message for the user), not a bug.
bool is_ours(const std::exception& e);

// The words of one error line: "pentad: error: ..." (or "internal error"), with the rank
// when other ranks may print their own (rank < 0: no rank).
void print_error(const std::exception& e, int rank);

// What an action gets of the job it runs in (launch/errors.h builds it after MPI starts).
struct Job {
  int rank = 0, size = 1;
  MPI_Comm errors = MPI_COMM_NULL;  // kept for the ranks' agreement on an error alone
  // Runs `step` on every rank, none inside a collective; then the ranks agree on an error
  // before any of them prints it. Returns 0 when no rank failed, else the job's exit status.
  std::function<int(const std::function<void()>&)> on_every_rank;
};

// An action: its exit status, or an exception (reported by main: a pentad::Error refuses).
using Action = std::function<int(const Job&)>;
// A subcommand that runs before MPI starts, in place of everything else, with its own
// arguments (argv[0] its name): one that is no rank of a job.
using Standalone = int (*)(int argc, char** argv);

class Commands {
 public:
  explicit Commands(CLI::App& app) : app_(app) {}
  CLI::App& app() { return app_; }
  // A value the registry keeps as long as the app: what a command's options parse into.
  template <class T>
  T& keep() {
    auto value = std::make_shared<T>();
    kept_.push_back(value);
    return *value;
  }
  // `action` runs when `command` (a subcommand at any depth) was parsed.
  void add(CLI::App* command, Action action);
  // `pentad NAME ...` runs `main` before MPI starts; `command` lists it for --help.
  void add_standalone(CLI::App* command, Standalone main);
  // The standalone main that argv names, or nullptr.
  Standalone standalone(int argc, char** argv) const;
  // The parsed subcommand's action's status (0 where none was parsed).
  int run(const Job& job) const;

 private:
  CLI::App& app_;
  std::vector<std::pair<CLI::App*, Action>> actions_;
  std::vector<std::pair<std::string, Standalone>> standalones_;
  std::vector<std::shared_ptr<void>> kept_;
};

// The registrars of src/cli, each defined in its command's file.
void add_plot_command(Commands& commands);        // plot.cpp
void add_plan_command(Commands& commands);        // plan.cpp
void add_probe_command(Commands& commands);       // probe.cpp
void add_recipe_commands(Commands& commands);     // recipe_commands.cpp: recipe keys
void add_data_commands(Commands& commands);       // data_commands.cpp: data prepare
void add_tokenizer_commands(Commands& commands);  // tokenizer_commands.cpp: train, encode, decode
void add_ckpt_commands(Commands& commands);       // ckpt_commands.cpp: inspect, convert
void add_generate_command(Commands& commands);    // generate.cpp

}  // namespace pentad::cli
