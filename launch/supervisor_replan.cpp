// The Supervisor's --replan: the planner's calibration made before the job if missing, the
// restart's command re-planned for the ranks a fault left (replan.h), and the new layout's
// step measured against its prediction.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <vector>

#include "launch/job_command.h"
#include "launch/replan.h"
#include "launch/supervisor_internal.h"
#include "plan/calibration.h"

namespace pentad::launch {

namespace {

// Steps on a re-planned layout before its step time is taken (the detector's median is over
// the last 20 steps of each rank; the first steps after a resume warm up).
constexpr int64_t kMeasureSteps = 10;
// Around a slow link only when the steps run this many times slower than before it. The
// soak's falsely slow pipeline link, on 5 ms steps, read 1.0-1.15x and once 1.2x, and was
// re-planned for then (onto a layout twice as slow); the injected slow link reads 10-25x.
constexpr double kSlowerSteps = 1.5;

}  // namespace

// Before the first attempt, so that the measurement has the machine to itself: a re-plan
// without --cluster needs this machine's calibration (plan/calibration.h).
void Supervisor::ensure_calibration() {
  if (!o_.replan_cluster.empty()) return;
  const std::string path = default_calibration_path();
  if (std::filesystem::exists(path)) return;
  say(fmt::format("--replan: no calibration of this machine ({}); measuring it first, about 5 s",
                  path));
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  calibrate(false).write(path);
}

// A re-plan taken: logged, and its layout's step to be measured.
void Supervisor::adopt(const Replan& r) {
  event({{"event", "action"},
         {"action", "replan"},
         {"seconds", 0.0},
         {"layout_before", r.layout_before},
         {"layout_after", r.layout_after},
         {"ranks_before", r.ranks_before},
         {"ranks_after", r.ranks_after},
         {"predicted_step_s_before", r.predicted_before_s},
         {"predicted_step_s_after", r.predicted_after_s},
         {"global_batch", r.global_batch}});
  say("action: " + r.note);
  measure_ = PendingMeasure{r.layout_after, r.predicted_after_s, -1};
}

// The command for the ranks `fault` leaves: its culprit's ranks (a host's, for a host fault)
// are gone. A fault between ranks that all still run (a link's comm hang) leaves every rank:
// the job restarts as it was. Nothing when no layout suits the ranks that remain: the job
// ends, the line saying why (the planner's refusal says what would fit).
std::optional<std::vector<std::string>> Supervisor::replanned(
    const std::vector<std::string>& command, const Detection& fault) {
  if (fault.slow() || (fault.cls == "comm hang" && fault.culprit.size() > 1)) {
    const std::string why =
        fmt::format("a {} between ranks that all still run leaves no rank out", fault.cls);
    event({{"event", "action"}, {"action", "replan"}, {"refused", why}, {"seconds", 0.0}});
    say("--replan: " + why + "; restarting with the same layout");
    return command;
  }
  std::string why;
  const Replan r = replan_after_loss(command, layout_, world_, int(fault.culprit.size()),
                                     {o_.replan_cluster, default_calibration_path()}, &why);
  if (r.command.empty()) {
    event({{"event", "action"}, {"action", "replan"}, {"refused", why}, {"seconds", 0.0}});
    event({{"event", "action"}, {"action", "give_up"}, {"why", "replan"}, {"seconds", 0.0}});
    say(fmt::format("--replan: {}; ending the job ({})", why, events_.where()));
    return std::nullopt;
  }
  adopt(r);
  if (!fault.host_fault()) return r.command;
  // The ranks that remain run on the other hosts: the launcher's host list without this one.
  std::string note;
  std::vector<std::string> elsewhere = without_host(r.command, fault.host, &note);
  event({{"event", "action"},
         {"action", "exclude_host"},
         {"host", fault.host},
         {"seconds", 0.0},
         {"rewrite", note}});
  say(note.empty() ? fmt::format("--replan: the job command names no host list with {} in it; "
                                 "the launcher places the {} ranks",
                                 fault.host, r.ranks_after)
                   : fmt::format("--replan: {} left out: {}", fault.host, note));
  return elsewhere;
}

// The planner asked for the same ranks with the link slowed as the detector measured it; a
// restart on its layout pays the start-up this attempt took (its start to its first step)
// and the steps since the oldest checkpoint, trained again at the new layout's pace. It
// saves the step's predicted ratio (slowed layout to the re-planned one) of the measured step
// over the steps left. Restart when the saving is --replan-gain times the cost.
bool Supervisor::around_slow_link(const Detection& d, const Detector& detector) {
  // Between two hosts, a throttled host link slows every pair across it (the detector names
  // the first it finds): all of them are slowed.
  std::vector<parallel::SlowLink> links = {{d.culprit[0], d.culprit[1], d.factor}};
  if (!d.peer_host.empty()) {
    links.clear();
    for (const auto& [a, ra] : detector.ranks())
      for (const auto& [b, rb] : detector.ranks())
        if (a < b && ((ra.host == d.host && rb.host == d.peer_host) ||
                      (ra.host == d.peer_host && rb.host == d.host)))
          links.push_back({a, b, d.factor});
  }
  std::string why;
  const Replan r = replan_around(command_, layout_, world_, links,
                                 {o_.replan_cluster, default_calibration_path()}, &why);
  nlohmann::json e = {{"event", "action"},    {"action", "replan"},
                      {"cause", "slow link"}, {"link", d.culprit},
                      {"factor", d.factor},   {"seconds", now() - d.detected_at}};
  if (r.command.empty()) {
    e["refused"] = why;
    event(e);
    say("--replan around the slow link: " + why + "; going on as it is");
    return false;
  }
  int64_t step = 0, ckpt = std::numeric_limits<int64_t>::max(), resumed = 0;
  for (const auto& [rank, rs] : detector.ranks()) {
    step = std::max(step, rs.step);
    ckpt = std::min(ckpt, rs.ckpt_step);
    resumed = std::max(resumed, rs.resume_step);
  }
  const double measured = detector.median_step_seconds();
  // What the steps took before the link's first sign: a link that reads slow while the
  // steps do not run slower costs too little to re-plan for. A pipeline's small transfers
  // read slower per MB than a ring's large chunks by nature (the soak's grown pp 2 x dp 4
  // once read link 0-4 "slow" so). The lesser of two medians: the ranks' recent steps seen
  // before the sign, and the attempt's first steps whenever they were seen. Under load the
  // sign once came so late that every recent step before it was already slow; and steps much
  // shorter than a beat arrive with the sign in one beat, so none is seen before it (the
  // first steps then still tell a link slowed mid-run from one slow from the start).
  auto median_of = [&](auto records, bool before_sign) {
    std::vector<double> before;
    for (const auto& [rank, rs] : detector.ranks())
      for (const StepRecord& h : records(rs))
        if ((!before_sign || h.seen_at < d.first_sign_at) && h.step > rs.resume_step + 1)
          before.push_back(h.step_seconds);
    if (before.empty()) return 0.0;
    std::nth_element(before.begin(), before.begin() + long(before.size() / 2), before.end());
    return before[before.size() / 2];
  };
  const double recent = median_of(
      [](const RankState& rs) -> const auto& { return rs.history; }, true);
  const double early = median_of(
      [](const RankState& rs) -> const auto& { return rs.early; }, false);
  const double usual = recent > 0 && early > 0 ? std::min(recent, early) : std::max(recent, early);
  const double ratio = r.predicted_before_s > 0 ? r.predicted_after_s / r.predicted_before_s : 1.0;
  const int64_t lost = step - std::max(ckpt, resumed);
  const double startup = first_step_at_ ? *first_step_at_ - attempt_at_ : 0.0;
  const double cost = startup + double(lost) * measured * ratio;
  const double saved = double(std::max<int64_t>(0, r.steps - step)) * measured * (1 - ratio);
  e.update({{"layout_before", r.layout_before},
            {"layout_after", r.layout_after},
            {"ranks_before", r.ranks_before},
            {"ranks_after", r.ranks_after},
            {"predicted_step_s_before", r.predicted_before_s},
            {"predicted_step_s_after", r.predicted_after_s},
            {"measured_step_s", measured},
            {"global_batch", r.global_batch},
            {"restart_cost_s", cost},
            {"saved_s", saved}});
  e["step_s_before_the_link"] = usual;
  std::string stay;
  if (usual <= 0)
    stay =
        "no step of this attempt ran before the link read slow: nothing says it slows the "
        "steps (this layout's own traffic may read so)";
  else if (measured < kSlowerSteps * usual)
    stay = fmt::format(
        "the steps take {:.3g} s, {:.2f}x what they took before the link read slow "
        "({:.3g} s): under {}x, not worth a restart",
        measured, measured / usual, usual, kSlowerSteps);
  else if (r.layout_after == r.layout_before)
    stay = "the job's layout " + r.layout_before + " is already the best with the link slowed";
  else if (!(saved >= o_.replan_gain * cost))
    stay = fmt::format(
        "{} would save {:.3g} s over the {} steps left, under --replan-gain {} x the restart's "
        "{:.3g} s (start-up {:.3g} s, {} steps since the checkpoint)",
        r.layout_after, saved, r.steps - step, o_.replan_gain, cost, startup, lost);
  if (!stay.empty()) {
    e["stayed"] = stay;
    event(e);
    say("--replan around the slow link: " + stay + "; going on as it is");
    return false;
  }
  event(e);
  say(fmt::format("action: {}; saves {:.3g} s against the restart's {:.3g} s", r.note, saved,
                  cost));
  measure_ = PendingMeasure{r.layout_after, r.predicted_after_s, -1};
  slow_command_ = r.command;
  slow_fault_ = d;
  return true;
}

// Once the re-planned job has run kMeasureSteps steps past its resume: its median step.
void Supervisor::note_measured(const RankState& r, const Detector& detector) {
  if (measure_->from_step < 0 || r.step < measure_->from_step + kMeasureSteps) return;
  const double measured = detector.median_step_seconds();
  event({{"event", "measured"},
         {"layout", measure_->layout},
         {"step_s", measured},
         {"predicted_step_s", measure_->predicted_s}});
  say(fmt::format("the re-planned layout {} runs {:.3g} s a step (predicted {:.3g} s)",
                  measure_->layout, measured, measure_->predicted_s));
  measure_.reset();
}

// SIGUSR2 under --replan, with the job on fewer ranks than its first attempt: true once every
// rank has committed a checkpoint newer than the one they had when it came (the restart then
// loses no step); the signal is answered with a line at once.
bool Supervisor::grow_due(const Detector& detector) {
  if (!g_grow_signal) return false;
  auto oldest_ckpt = [&] {
    int64_t oldest = std::numeric_limits<int64_t>::max();
    for (const auto& [rank, r] : detector.ranks()) oldest = std::min(oldest, r.ckpt_step);
    return detector.ranks().empty() ? int64_t{-1} : oldest;
  };
  if (grow_after_ckpt_ == -2) {
    g_grow_signal = 0;
    if (!o_.replan || world_ >= full_world_ || int(detector.ranks().size()) < world_) {
      say(fmt::format("SIGUSR2: nothing to grow back to ({} of {} ranks run{})", world_,
                      full_world_, o_.replan ? "" : "; needs --replan"));
      return false;
    }
    grow_after_ckpt_ = oldest_ckpt();
    event({{"event", "grow"},
           {"ranks", world_},
           {"full_ranks", full_world_},
           {"after_ckpt_step", grow_after_ckpt_}});
    say(fmt::format("SIGUSR2: growing back to {} ranks after the next checkpoint (past step {})",
                    full_world_, grow_after_ckpt_));
    g_grow_signal = 1;
  }
  if (oldest_ckpt() <= grow_after_ckpt_) return false;
  g_grow_signal = 0;
  grow_after_ckpt_ = -2;
  return true;
}

// The command for the full count again, re-planned for it; the command as it is if the
// planner refuses (the job goes on where it was).
std::vector<std::string> Supervisor::grown(const std::vector<std::string>& command) {
  std::string why;
  const Replan r = replan_to(command, layout_, world_, full_world_,
                             {o_.replan_cluster, default_calibration_path()}, &why);
  if (r.command.empty()) {
    event({{"event", "action"}, {"action", "replan"}, {"refused", why}, {"seconds", 0.0}});
    say("--replan: growing back refused: " + why + "; restarting as it was");
    return command;
  }
  adopt(r);
  return r.command;
}

}  // namespace pentad::launch
