#pragma once
// Reading and rewriting the job command `pentad launch` runs (LAUNCHER... pentad train RECIPE
// [overrides] [--resume ...]): where the pentad command starts, the launcher's rank count, the
// recipe and its overrides. Shared by --exclude-culprit (exclude.h) and --replan (replan.h).
#include <string>
#include <vector>

namespace pentad::launch {

// The index of "train" right after the pentad binary (the launcher's arguments come before);
// command.size() when there is none.
size_t pentad_train_at(const std::vector<std::string>& command);

// Drops every override of `key` after `train_at`: "--set KEY=..." pairs and bare "KEY=..."
// arguments (pentad train takes both), so that a rewrite can set it anew.
void drop_override(std::vector<std::string>& command, const std::string& key, size_t train_at = 0);

// Where the launcher's rank count sits before `train_at`: the index of the argument holding it
// and what precedes the number there ("--ntasks=" for srun's joined form, else ""). Each
// launcher's own flags: srun's -c is CPUs per task, not a rank count as mpirun's is.
struct RankCount {
  size_t at = 0;  // 0: none found
  std::string prefix;
};
RankCount find_rank_count(const std::vector<std::string>& command, size_t train_at);

// The command with `host` left out of the launcher's hosts, for a restart after that host
// failed: mpirun's --hostfile/--machinefile FILE (a copy without the host's lines, written as
// FILE.without-HOST) and --host/-H LIST (its entries for the host dropped), by the name the
// host's ranks reported; srun's --exclude= (the host added). `note` says what changed (""
// where nothing named the host: a launcher that places ranks by itself, or a list that names
// it otherwise, by address).
std::vector<std::string> without_host(const std::vector<std::string>& command,
                                      const std::string& host, std::string* note);

// The recipe's overrides on the pentad command, in order ("--set K=V" and bare "K=V").
std::vector<std::string> recipe_overrides(const std::vector<std::string>& command, size_t train_at);

}  // namespace pentad::launch
