// The command line's registry (cli/command.h).
#include "cli/command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/check.h"

namespace pentad::cli {

bool is_ours(const std::exception& e) {
  return dynamic_cast<const pentad::Error*>(&e) != nullptr;
}

void print_error(const std::exception& e, int rank) {
  const char* what = is_ours(e) ? "error" : "internal error";
  if (rank < 0)
    std::fprintf(stderr, "pentad: %s: %s\n", what, e.what());
  else
    std::fprintf(stderr, "pentad: %s (rank %d): %s\n", what, rank, e.what());
  std::fflush(stderr);
}

void Commands::add(CLI::App* command, Action action) {
  actions_.emplace_back(command, std::move(action));
}

void Commands::add_standalone(CLI::App* command, Standalone main) {
  standalones_.emplace_back(command->get_name(), main);
}

Standalone Commands::standalone(int argc, char** argv) const {
  if (argc < 2) return nullptr;
  for (const auto& [name, main] : standalones_)
    if (argv[1] == name) return main;
  return nullptr;
}

int Commands::run(const Job& job) const {
  for (const auto& [command, action] : actions_)
    if (command->parsed()) return action(job);
  return 0;
}

}  // namespace pentad::cli
