#include "launch/job_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/check.h"

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

std::vector<std::string> without_host(const std::vector<std::string>& command,
                                      const std::string& host, std::string* note) {
  std::vector<std::string> out = command;
  note->clear();
  const size_t train_at = pentad_train_at(command);
  const bool srun = !command.empty() && command[0].substr(command[0].rfind('/') + 1) == "srun";
  auto first_word = [](const std::string& entry) {
    return entry.substr(0, entry.find_first_of(": \t"));
  };
  for (size_t i = 0; i + 1 < train_at && i + 1 < out.size(); ++i) {
    const std::string& flag = out[i];
    if (!srun && (flag == "--hostfile" || flag == "-hostfile" || flag == "--machinefile" ||
                  flag == "-machinefile")) {
      std::ifstream in(out[i + 1]);
      if (!in) fail("pentad launch: cannot read the hostfile {} to leave {} out", out[i + 1], host);
      std::ostringstream kept;
      int dropped = 0;
      for (std::string line; std::getline(in, line);) {
        const size_t start = line.find_first_not_of(" \t");
        if (start != std::string::npos && first_word(line.substr(start)) == host) {
          ++dropped;
          continue;
        }
        kept << line << "\n";
      }
      if (dropped == 0) continue;
      const std::string copy = out[i + 1] + ".without-" + host;
      std::ofstream(copy) << kept.str();
      *note = fmt::format("{} {} (without {})", flag, copy, host);
      out[i + 1] = copy;
    } else if (!srun && (flag == "--host" || flag == "-host" || flag == "-H")) {
      std::string kept;
      bool dropped = false;
      std::stringstream list(out[i + 1]);
      for (std::string entry; std::getline(list, entry, ',');)
        if (first_word(entry) == host)
          dropped = true;
        else
          kept += (kept.empty() ? "" : ",") + entry;
      if (!dropped) continue;
      *note = fmt::format("{} {} (without {})", flag, kept, host);
      out[i + 1] = kept;
    }
  }
  if (srun && train_at < out.size()) {
    for (size_t i = 0; i < train_at; ++i)
      if (out[i].rfind("--exclude=", 0) == 0) {
        out[i] += "," + host;
        *note = out[i];
        return out;
      }
    out.insert(out.begin() + 1, "--exclude=" + host);
    *note = "--exclude=" + host;
  }
  return out;
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
