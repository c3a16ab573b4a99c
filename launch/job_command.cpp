#include "launch/job_command.h"

#include <algorithm>

namespace pentad::launch {

size_t pentad_train_at(const std::vector<std::string>& command) {
  for (size_t i = 1; i < command.size(); ++i)
    if (command[i] == "train" && command[i - 1].find("pentad") != std::string::npos) return i;
  return command.size();
}

namespace {

// A bare override: KEY=VALUE with a dotted key, not an option.
bool bare_override(const std::string& arg) {
  const size_t eq = arg.find('=');
  return !arg.empty() && arg[0] != '-' && eq != std::string::npos &&
         arg.substr(0, eq).find('.') != std::string::npos;
}

}  // namespace

void drop_override(std::vector<std::string>& command, const std::string& key, size_t train_at) {
  for (size_t i = train_at; i < command.size();)
    if (command[i] == "--set" && i + 1 < command.size() && command[i + 1].rfind(key + "=", 0) == 0)
      command.erase(command.begin() + long(i), command.begin() + long(i) + 2);
    else if (i > train_at + 1 && bare_override(command[i]) && command[i].rfind(key + "=", 0) == 0)
      command.erase(command.begin() + long(i));
    else
      ++i;
}

RankCount find_rank_count(const std::vector<std::string>& command, size_t train_at) {
  const std::string launcher = command.empty() ? "" : command[0].substr(command[0].rfind('/') + 1);
  const std::vector<std::string> flags =
      launcher == "srun" ? std::vector<std::string>{"-n", "--ntasks"}
                         : std::vector<std::string>{"-np", "-n", "--np", "--n", "-c"};
  RankCount found;
  for (size_t i = 0; i < train_at && i < command.size(); ++i) {
    if (i + 1 < train_at && std::find(flags.begin(), flags.end(), command[i]) != flags.end())
      found = {i + 1, ""};
    else if (launcher == "srun" && command[i].rfind("--ntasks=", 0) == 0)
      found = {i, "--ntasks="};
  }
  return found;
}

std::vector<std::string> recipe_overrides(const std::vector<std::string>& command,
                                          size_t train_at) {
  std::vector<std::string> overrides;
  for (size_t i = train_at + 2; i < command.size(); ++i)
    if (command[i] == "--set" && i + 1 < command.size())
      overrides.push_back(command[++i]);
    else if (bare_override(command[i]))
      overrides.push_back(command[i]);
  return overrides;
}

}  // namespace pentad::launch
