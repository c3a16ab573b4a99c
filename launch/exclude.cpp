#include "launch/exclude.h"

#include <fmt/format.h>

#include <algorithm>

namespace pentad::launch {
namespace {

// The index of "train" right after the pentad binary: the launcher's arguments come before.
size_t pentad_train_at(const std::vector<std::string>& command) {
  for (size_t i = 1; i < command.size(); ++i)
    if (command[i] == "train" && command[i - 1].find("pentad") != std::string::npos) return i;
  return command.size();
}

// Drops "--set KEY=..." pairs for `key`: the rewrite sets it anew.
void drop_set(std::vector<std::string>& command, const std::string& key) {
  for (size_t i = 0; i + 1 < command.size();)
    if (command[i] == "--set" && command[i + 1].rfind(key + "=", 0) == 0)
      command.erase(command.begin() + long(i), command.begin() + long(i) + 2);
    else
      ++i;
}

// Where the launcher's rank count sits before `train_at`: the index of the argument holding it
// and what precedes the number there ("--ntasks=" for srun's joined form, else ""). Each
// launcher's own flags: srun's -c is CPUs per task, not a rank count as mpirun's is.
struct RankCount {
  size_t at = 0;  // 0: none found
  std::string prefix;
};
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

}  // namespace

Exclusion exclude_one_replica(const std::vector<std::string>& command, const nlohmann::json& layout,
                              int world, std::string* why) {
  Exclusion x;
  auto degree = [&](const char* axis) { return layout.value(axis, 1); };
  if (!layout.is_object() || !layout.contains("dp")) {
    *why = "the ranks did not report their layout (a pentad without it in its hello?)";
    return x;
  }
  const int dp = degree("dp");
  if (dp <= 1) {
    *why = fmt::format("parallel.dp is {}: there is no data-parallel replica to spare", dp);
    return x;
  }
  const int tp = degree("tp"), cp = degree("cp"), ep = degree("ep"), etp = degree("etp");
  if ((dp - 1) * cp * tp % (ep * etp) != 0) {
    *why = fmt::format(
        "dp {} x cp {} x tp {} ranks would not split into ep {} x etp {} "
        "expert groups",
        dp - 1, cp, tp, ep, etp);
    return x;
  }
  const size_t train_at = pentad_train_at(command);
  const RankCount count = find_rank_count(command, train_at);
  if (train_at == command.size() || count.at == 0) {
    *why =
        "the job command has no launcher rank count (-np N, -n N or srun's --ntasks=N before "
        "`pentad train`) to lower";
    return x;
  }
  const std::string ranks = command[count.at].substr(count.prefix.size());
  if (ranks != std::to_string(world)) {
    const std::string flag = count.prefix.empty() ? command[count.at - 1] + " " : "";
    *why = fmt::format("the launcher starts {} ranks ({}{}) but the job reported {}", ranks, flag,
                       command[count.at], world);
    return x;
  }
  const int64_t micro = layout.value("micro_batch", int64_t{0});
  const int64_t accum = layout.value("grad_accum", int64_t{1});
  x.command = command;
  x.dp_before = dp;
  x.dp_after = dp - 1;
  x.ranks_before = world;
  x.ranks_after = world - world / dp;
  x.command[count.at] = count.prefix + std::to_string(x.ranks_after);
  drop_set(x.command, "parallel.dp");
  x.command.insert(x.command.end(), {"--set", fmt::format("parallel.dp={}", dp - 1)});
  x.global_batch_before = micro * accum * dp;
  if (accum * dp % (dp - 1) == 0) {
    drop_set(x.command, "train.grad_accum");
    x.command.insert(x.command.end(),
                     {"--set", fmt::format("train.grad_accum={}", accum * dp / (dp - 1))});
    x.global_batch_after = x.global_batch_before;
  } else {
    x.global_batch_after = micro * accum * (dp - 1);
  }
  x.note = fmt::format(
      "one data-parallel replica fewer: dp {} -> {}, {} -> {} ranks; global batch {} -> {} "
      "sequences{}",
      dp, dp - 1, world, x.ranks_after, x.global_batch_before, x.global_batch_after,
      x.global_batch_after == x.global_batch_before
          ? " (grad_accum raised)"
          : " (grad_accum x dp does not divide by dp - 1: each step sees fewer sequences)");
  return x;
}

}  // namespace pentad::launch
