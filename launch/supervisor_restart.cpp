// The Supervisor's restart loop: an attempt, and after a fault how far it got, whether to
// give up, the wait before the next attempt (the backoff, a checkpoint directory to clear)
// and the next attempt's command.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "launch/exclude.h"
#include "launch/supervisor_internal.h"

namespace pentad::launch {

namespace {

using nlohmann::json;

// The ranks' beat interval (launch/train_command.cpp's Monitor).
constexpr double kBeatSeconds = 0.1;
// While it waits for a checkpoint directory to clear, a line this often.
constexpr double kNoteSeconds = 10.0;

// The last step world rank 0 wrote to <out_dir>/metrics.jsonl during this attempt (a line a
// step, flushed as written): the furthest step the job finished, beats or not. -1 where
// there is none (no step logged since `since`, or the file is elsewhere).
int64_t last_logged_step(const std::string& out_dir, std::filesystem::file_time_type since) {
  const std::filesystem::path path = std::filesystem::path(out_dir) / "metrics.jsonl";
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(path, ec);
  if (ec || written < since) return -1;
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - (64 << 10));
  in.seekg(from);
  std::string line;
  if (from > 0) std::getline(in, line);  // a part line
  int64_t step = -1;
  while (std::getline(in, line)) {
    const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("loss") && row.contains("step") &&
        row["step"].is_number_integer())
      step = row["step"].get<int64_t>();
  }
  return step;
}

// What a fault's restarts back off by: its class and culprit, and the cause a rank named.
std::string cause_of(const Detection& fault, const Detector& detector) {
  std::string cause = fault.cls + ", " + culprit_words(fault.culprit);
  for (const auto& [rank, r] : detector.ranks())
    if (!r.cause_kind.empty()) return cause + ", " + r.cause_kind + " " + r.cause_path;
  return cause;
}

// The checkpoint directories a restart needs, as the local ranks named them: the first
// train.ckpt_dir (else the mirror) and the one where their saves failed. What is in the way
// of a restart there, if anything.
struct RestartStores {
  std::vector<std::string> dirs;  // train.ckpt_dir's, then the mirror's
  std::string failed_at;          // where the ranks' saves failed

  StoreCheck blocked(int64_t ckpt_step, bool committed_before) const {
    if (!dirs.empty()) {
      StoreCheck c = check_store(dirs[0], {ckpt_step, committed_before, failed_at == dirs[0]});
      if (!c.blocked.empty()) return c;
    }
    if (!failed_at.empty() && (dirs.empty() || failed_at != dirs[0]))
      return check_store(failed_at, {-1, false, true});
    return {};
  }
};

}  // namespace

Supervisor::Supervisor(LaunchOptions options)
    : o_(std::move(options)),
      server_(o_.port),
      events_(o_.events_path),
      monitor_(monitor_host() + ":" + std::to_string(server_.port())),
      start_(std::chrono::steady_clock::now()),
      policy_({o_.max_restarts, o_.backoff_s, o_.backoff_max_s, 0.25}, std::random_device{}()) {}

int Supervisor::run() {
  say(fmt::format("monitor at {}; job: {}", monitor_, fmt::join(o_.command, " ")));
  if (o_.replan) ensure_calibration();
  std::vector<std::string> command = o_.command;
  double prior_step_seconds = 0;
  for (int restarts = 0;; ++restarts) {
    Detector detector(
        {o_.hang_factor, o_.hang_floor_s, o_.beat_timeout_s, prior_step_seconds, o_.link_slow_s});
    conn_rank_.clear();
    local_ranks_.clear();
    gone_since_.clear();
    const auto attempt_start = std::filesystem::file_time_type::clock::now();
    command_ = command;
    attempt_at_ = now();
    first_step_at_.reset();
    std::vector<std::pair<std::string, std::string>> env = {
        {"PENTAD_MONITOR", monitor_}, {"PENTAD_LAUNCH_ATTEMPT", std::to_string(attempt_)}};
    // mpirun ends the ranks with SIGTERM after one died, then SIGKILL 1 s later by default:
    // too soon for the survivors to write their state (fsyncs of several ranks at once took
    // longer on the hosts testbed). Unless the user set it, the ranks get 10 s, as from the
    // supervisor's own ending (kEndGraceSeconds).
    if (!std::getenv("OMPI_MCA_odls_base_sigkill_timeout"))
      env.emplace_back("OMPI_MCA_odls_base_sigkill_timeout", "10");
    Job job(command, env);
    Detection fault;
    const End end = run_attempt(job, detector, &fault);
    if (end == End::kDone) return exit_with(0, restarts);
    if (end == End::kRefused) {
      // The same recipe, files and layout would be refused again: no restart, no exclusion.
      // The job is ended first, so that the decision is the last line.
      end_job(job, detector);
      event({{"event", "refused"}, {"reason", fault.reason}});
      say("the job was refused before its first step" +
          (fault.reason.empty() ? std::string(" (its ranks printed why)") : ": " + fault.reason) +
          "; not restarting");
      return exit_with(2, restarts);
    }
    // Growing back, or a layout re-planned around a slow link: not failures (no backoff,
    // nothing counted, no dump).
    if (end == End::kGrow || end == End::kReplan) {
      const bool grow = end == End::kGrow;
      end_job(job, detector, false);
      if (detector.median_step_seconds() > 0 && grow)
        prior_step_seconds = detector.median_step_seconds();
      int64_t unseen = 0;
      recovery_ = how_far(grow ? Detection("grow", {}, now(), now(), "") : slow_fault_, detector,
                          attempt_start, &unseen);
      command = with_resume_latest(grow ? grown(command) : slow_command_);
      ++attempt_;
      event({{"event", "action"},
             {"action", "restart"},
             {"seconds", now() - recovery_->detected_at},
             {"command", command},
             {"cause", grow ? "grow" : "slow link"},
             {"in_a_row", 0}});
      say(fmt::format("action: restart as attempt {} {}: {}", attempt_,
                      grow ? "on the full count" : "around the slow link",
                      fmt::join(command, " ")));
      continue;
    }
    if (end == End::kStopped) {
      say(fmt::format("signal {}: ending the job", int(g_stop_signal)));
      end_job(job, detector);
      return exit_with(128 + g_stop_signal, restarts);
    }
    end_job(job, detector);  // the ranks' beats meanwhile say how far they got
    if (detector.median_step_seconds() > 0) prior_step_seconds = detector.median_step_seconds();
    int64_t unseen = 0;
    const Recovery recovery = how_far(fault, detector, attempt_start, &unseen);
    const std::string cause = cause_of(fault, detector);
    const RestartPolicy::Decision decision = policy_.failed(cause, recovery.last_step, unseen);
    if (decision.give_up) {
      event({{"event", "action"},
             {"action", "give_up"},
             {"seconds", 0.0},
             {"failures", decision.in_a_row},
             {"past_step", decision.past_step}});
      say(fmt::format(
          "the job failed {} times in a row, more than --max-restarts {} (no attempt got {} "
          "steps past step {}); giving up ({})",
          decision.in_a_row, o_.max_restarts, RestartPolicy::kClearSteps, decision.past_step,
          events_.where()));
      return exit_with(1, restarts);
    }
    if (const std::optional<int> status =
            wait_to_restart(decision, cause, detector, recovery.ckpt_step, fault))
      return exit_with(*status, restarts);
    recovery_ = recovery;
    command = with_resume_latest(command);
    if (o_.exclude_culprit && !fault.culprit.empty()) command = without_a_replica(command);
    if (o_.replan && !fault.culprit.empty()) {
      const std::optional<std::vector<std::string>> replan = replanned(command, fault);
      if (!replan) return exit_with(1, restarts);
      command = *replan;
    }
    ++attempt_;
    const double seconds = now() - fault.detected_at;
    event({{"event", "action"},
           {"action", "restart"},
           {"seconds", seconds},
           {"command", command},
           {"cause", cause},
           {"in_a_row", decision.in_a_row}});
    say(fmt::format(
        "action: restart as attempt {} ({:.2f} s after the detection; failure {} in "
        "a row of at most {}): {}",
        attempt_, seconds, decision.in_a_row, o_.max_restarts + 1, fmt::join(command, " ")));
  }
}

// How far the failed attempt got: the furthest step a rank finished and the oldest step a
// rank had a checkpoint of. The beats say it up to the last one before the ranks ended; where
// the launcher killed them all at once, steps shorter than a beat may have gone unseen
// (*unseen: how many). Rank 0's metrics say it exactly, where this machine can read them.
Supervisor::Recovery Supervisor::how_far(const Detection& fault, const Detector& detector,
                                         std::filesystem::file_time_type attempt_start,
                                         int64_t* unseen) const {
  Recovery recovery{fault.detected_at, 0, -1, std::nullopt, 0};
  bool any = false;
  for (const auto& [rank, r] : detector.ranks()) {
    recovery.last_step = std::max(recovery.last_step, r.step);
    recovery.ckpt_step = any ? std::min(recovery.ckpt_step, r.ckpt_step) : r.ckpt_step;
    any = true;
  }
  const auto zero = detector.ranks().find(0);
  const int64_t logged = zero != detector.ranks().end() && local_ranks_.count(0)
                             ? last_logged_step(zero->second.out_dir, attempt_start)
                             : -1;
  if (logged >= 0)
    recovery.last_step = std::max(recovery.last_step, logged);
  else if (detector.median_step_seconds() > 0)
    *unseen = int64_t(std::ceil(kBeatSeconds / detector.median_step_seconds())) + 1;
  return recovery;
}

// The backoff, then until every checkpoint directory the restart needs allows it (checked
// where this machine sees it: with ranks of its own) and, after a host fault, until that
// host answers. Returns the exit status when the supervisor gives up instead (a directory
// that did not clear, a host that did not answer, a stop signal).
std::optional<int> Supervisor::wait_to_restart(const RestartPolicy::Decision& decision,
                                               const std::string& cause, const Detector& detector,
                                               int64_t ckpt_step, const Detection& fault) {
  RestartStores stores;
  for (const auto& [rank, r] : detector.ranks()) {
    if (!local_ranks_.count(rank)) continue;
    if (stores.dirs.empty()) stores.dirs = r.ckpt_dirs;
    if (r.cause_kind == "checkpoint_save" && stores.failed_at.empty())
      stores.failed_at = r.cause_path;
  }
  if (ckpt_step >= 0) committed_before_ = true;
  const double start = now(), backoff_until = start + decision.wait_s;
  if (decision.wait_s > 0) {
    event({{"event", "wait"},
           {"why", "backoff"},
           {"seconds", decision.wait_s},
           {"same_cause", decision.same_cause},
           {"cause", cause}});
    say(
        fmt::format("waiting {:.1f} s before restarting (restart {} in a row for {}; "
                    "--backoff-s {}, --backoff-max-s {})",
                    decision.wait_s, decision.same_cause, cause, o_.backoff_s, o_.backoff_max_s));
  }
  std::string waiting_for;  // the storage wait under way, if any
  bool waiting_for_host = false;
  double next_note = 0;
  for (;;) {
    if (g_stop_signal) {
      say(fmt::format("signal {}: not restarting", int(g_stop_signal)));
      return 128 + g_stop_signal;
    }
    const StoreCheck c = stores.blocked(ckpt_step, committed_before_);
    // Under --replan the restart leaves a failed host out: nothing to wait for.
    const bool host_away = fault.host_fault() && !o_.replan && !host_answers(fault.host, 0.5);
    if (host_away && !waiting_for_host) {
      waiting_for_host = true;
      event({{"event", "wait"},
             {"why", "host"},
             {"host", fault.host},
             {"timeout_s", o_.host_wait_s}});
      say(
          fmt::format("waiting before restarting (up to --host-wait-s {}): host {} does not "
                      "answer",
                      o_.host_wait_s, fault.host));
    }
    if (host_away && now() - start >= o_.host_wait_s) return give_up_on_host(fault.host, start);
    if (c.blocked.empty() && !host_away && now() >= backoff_until) break;
    if (!c.blocked.empty()) {
      if (waiting_for.empty()) {
        waiting_for = c.blocked;
        event({{"event", "wait"},
               {"why", c.blocked},
               {"what", c.words},
               {"free_bytes", c.free_bytes},
               {"needed_bytes", c.needed_bytes},
               {"timeout_s", o_.storage_wait_s}});
        say(fmt::format("waiting before restarting (up to --storage-wait-s {}): {}",
                        o_.storage_wait_s, c.words));
        next_note = now() + kNoteSeconds;
      }
      if (now() - start >= o_.storage_wait_s) return give_up_waiting(c, start);
      if (now() >= next_note) {
        say(fmt::format("still waiting, {:.0f} s: {}", now() - start, c.words));
        next_note += kNoteSeconds;
      }
    }
    sleep_a_tick();
  }
  if (decision.wait_s > 0 || !waiting_for.empty())
    event({{"event", "waited"},
           {"why", waiting_for.empty() ? "backoff" : waiting_for},
           {"seconds", now() - start},
           {"cleared", true}});
  if (!waiting_for.empty())
    say(fmt::format("the checkpoint directory cleared after {:.1f} s", now() - start));
  if (waiting_for_host) {
    event({{"event", "waited"},
           {"why", "host"},
           {"host", fault.host},
           {"seconds", now() - start},
           {"cleared", true}});
    say(fmt::format("host {} answers again after {:.1f} s", fault.host, now() - start));
  }
  return std::nullopt;
}

// --host-wait-s ran out with `host` still silent: says so, and returns the exit status.
int Supervisor::give_up_on_host(const std::string& host, double start) {
  event({{"event", "waited"},
         {"why", "host"},
         {"host", host},
         {"seconds", now() - start},
         {"cleared", false}});
  event({{"event", "action"},
         {"action", "give_up"},
         {"seconds", 0.0},
         {"why", "host"},
         {"host", host}});
  say(
      fmt::format("giving up after waiting {:.0f} s: host {} does not answer (its link or the "
                  "host is down); bring it back, or run on the other hosts (a smaller layout), "
                  "then run again with --resume latest ({})",
                  now() - start, host, events_.where()));
  return 1;
}

// --storage-wait-s ran out with `c` still in the way (waiting since `start`): says what to do
// about it, and returns the exit status.
int Supervisor::give_up_waiting(const StoreCheck& c, double start) {
  event({{"event", "waited"}, {"why", c.blocked}, {"seconds", now() - start}, {"cleared", false}});
  event({{"event", "action"},
         {"action", "give_up"},
         {"seconds", 0.0},
         {"why", c.blocked},
         {"what", c.words},
         {"mount_point", c.mount_point},
         {"free_bytes", c.free_bytes},
         {"needed_bytes", c.needed_bytes}});
  say(fmt::format("giving up after waiting {:.0f} s: {}; {} ({})", now() - start, c.words,
                  c.blocked == "checkpoint_space"
                      ? "free space there or point train.ckpt_dir / train.ckpt_mirror "
                        "elsewhere, then run again with --resume latest"
                      : "mount it again, then run again with --resume latest",
                  events_.where()));
  return 1;
}

// --exclude-culprit: the command with one data-parallel replica fewer, or (refused, saying
// why) the command as it was: a restart that keeps the layout beats none.
std::vector<std::string> Supervisor::without_a_replica(const std::vector<std::string>& command) {
  std::string why;
  const Exclusion x = exclude_one_replica(command, layout_, world_, &why);
  if (x.command.empty()) {
    event({{"event", "action"}, {"action", "exclude"}, {"refused", why}, {"seconds", 0.0}});
    say("--exclude-culprit refused: " + why + "; restarting with the same layout");
    return command;
  }
  event({{"event", "action"},
         {"action", "exclude"},
         {"seconds", 0.0},
         {"layout_before", {{"dp", x.dp_before}, {"ranks", x.ranks_before}}},
         {"layout_after", {{"dp", x.dp_after}, {"ranks", x.ranks_after}}},
         {"global_batch_before", x.global_batch_before},
         {"global_batch_after", x.global_batch_after}});
  say("action: exclude: " + x.note);
  return x.command;
}

}  // namespace pentad::launch
