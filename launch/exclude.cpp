#include "launch/exclude.h"

#include <fmt/format.h>

#include <algorithm>

#include "launch/job_command.h"

namespace pentad::launch {
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
  drop_override(x.command, "parallel.dp", train_at);
  x.command.insert(x.command.end(), {"--set", fmt::format("parallel.dp={}", dp - 1)});
  x.global_batch_before = micro * accum * dp;
  if (accum * dp % (dp - 1) == 0) {
    drop_override(x.command, "train.grad_accum", train_at);
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
