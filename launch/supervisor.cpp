#include "launch/supervisor.h"

#include <fmt/ranges.h>
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "core/check.h"
#include "launch/detector.h"
#include "launch/exclude.h"
#include "launch/job.h"
#include "launch/monitor_server.h"
#include "launch/restart_policy.h"
#include "launch/store_check.h"

namespace pentad::launch {

namespace {

using nlohmann::json;

// How long a local rank's process may be gone, its connection still open and no bye read,
// before it counts as dead: time for its last messages and end of connection to arrive.
constexpr double kGoneGrace = 0.5;
// The ranks' beat interval (launch/train_command.cpp's Monitor).
constexpr double kBeatSeconds = 0.1;
// While it waits for a checkpoint directory to clear, a line this often.
constexpr double kNoteSeconds = 10.0;

constexpr const char* kUsage =
    R"(Usage: pentad launch [options] -- LAUNCHER... pentad train RECIPE [args]

Runs the job under supervision: detects a dead, hung or slow rank from the ranks' reports
of their own communication, has the ranks dump their communication traces, ends the job
and restarts it with --resume latest.

Options:
  --max-restarts N     restarts in a row before giving up (default 3): a restarted job that
                       trains 3 steps past the furthest step of the failed attempts clears
                       them, and the count starts again
  --backoff-s S        restarts in a row for the same cause wait 0, S, 2S, 4S, ... seconds,
                       each x a factor from 0.75 to 1.25 (default 2)
  --backoff-max-s S    ... at most S seconds (x that factor) (default 60)
  --storage-wait-s S   before a restart, wait up to S seconds for a checkpoint directory
                       to clear: one gone (an unmounted share), or one whose saves failed
                       without room there for a save; then give up saying which (default 30)
  --restart-on-slow    also restart on a slow rank or link (default: report only)
  --port P             monitor port, 0 = any free one (default 0)
  --hang-factor K      a wait longer than K x the median step time is a hang (default 5)
  --hang-floor-s S     ... and never shorter than S seconds (default 2.0)
  --beat-timeout-s S   a rank silent this long while others wait is unresponsive (default 1.0)
  --events PATH        event log (default: <out_dir>/events.jsonl, out_dir from the ranks)
  --exclude-culprit    restart with one data-parallel replica fewer after a fault with a
                       culprit (launch/exclude.h; on one machine: fewer ranks)

Every wait is in the event log ("wait" when it starts, "waited" when it ends).
)";

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

double number(const std::string& option, const std::string& text, double low, double high) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < low || v > high)
    fail("pentad launch: {} takes a number from {} to {}, not '{}'", option, low, high, text);
  return v;
}

std::string culprit_words(const std::vector<int>& culprit) {
  if (culprit.empty()) return "culprit unknown";
  if (culprit.size() == 1) return fmt::format("culprit rank {}", culprit[0]);
  return fmt::format("culprit ranks {}", fmt::join(culprit, ","));
}

json culprit_json(const std::vector<int>& culprit) {
  if (culprit.empty()) return nullptr;
  if (culprit.size() == 1) return culprit[0];
  return culprit;
}

// events.jsonl: one JSON object a line, appended and flushed as it happens. Before the
// ranks have said where their out_dir is, objects wait in memory.
class EventLog {
 public:
  explicit EventLog(std::string path) { open(path); }
  void open(const std::string& path) {
    if (!path_.empty() || path.empty()) return;
    path_ = path;
    const auto parent = std::filesystem::path(path).parent_path();
    std::error_code ignored;
    if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
    file_.open(path, std::ios::app);
    if (!file_)
      fail("pentad launch: cannot write the event log {} (choose one with --events)", path);
    for (const std::string& line : waiting_) file_ << line << '\n';
    waiting_.clear();
    file_.flush();
  }
  void write(const json& event) {
    if (path_.empty()) {
      waiting_.push_back(event.dump());
      return;
    }
    file_ << event.dump() << '\n';
    file_.flush();
  }
  std::string where() const {
    return path_.empty()
               ? "no event log: no rank said hello with its out_dir; --events PATH names one"
               : "events in " + path_;
  }

 private:
  std::string path_;
  std::ofstream file_;
  std::vector<std::string> waiting_;
};

void say(const std::string& line) {
  std::printf("pentad launch: %s\n", line.c_str());
  std::fflush(stdout);
}

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options)
      : o_(std::move(options)),
        server_(o_.port),
        events_(o_.events_path),
        monitor_(monitor_host() + ":" + std::to_string(server_.port())),
        start_(std::chrono::steady_clock::now()),
        policy_({o_.max_restarts, o_.backoff_s, o_.backoff_max_s, 0.25}, std::random_device{}()) {}

  int run();

 private:
  enum class End { kDone, kFault, kStopped, kRefused };
  End run_attempt(Job& job, Detector& detector, Detection* fault);
  std::vector<std::string> without_a_replica(const std::vector<std::string>& command);
  void handle_line(int conn, const std::string& line, Detector& detector);
  void report(const Detection& d, const Detector& detector);
  void end_job(Job& job, Detector& detector);
  std::optional<int> wait_to_restart(const RestartPolicy::Decision& decision,
                                     const std::string& cause, const Detector& detector,
                                     int64_t ckpt_step);
  void sleep_a_tick() {
    server_.poll(
        0.1, [](int, const std::string&) {}, [](int) {});
  }
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void event(json e) {
    e["t"] = now();
    e["attempt"] = attempt_;
    events_.write(e);
  }
  int exit_with(int status, int restarts) {
    event({{"event", "exit"}, {"status", status}, {"restarts", restarts}});
    return status;
  }

  LaunchOptions o_;
  MonitorServer server_;
  EventLog events_;
  std::string monitor_;
  std::chrono::steady_clock::time_point start_;
  int attempt_ = 0;
  std::map<int, int> conn_rank_;      // connection -> rank, once its hello arrived
  std::set<int> local_ranks_;         // ranks on this machine: their pids can be signalled
  std::map<int, double> gone_since_;  // local ranks whose process is gone, connection open
  json layout_;                       // the mesh degrees and batch the ranks reported (hello)
  int world_ = 0;
  bool warned_unreadable_ = false;
  RestartPolicy policy_;
  bool committed_before_ = false;  // some attempt reported a checkpoint committed (ckpt_step)

  // From a fault to the restarted job's first progress.
  struct Recovery {
    double detected_at = 0;
    int64_t last_step = 0, ckpt_step = -1;
    std::optional<double> hello_at;
    int64_t resume_step = 0;
  };
  std::optional<Recovery> recovery_;
};

// Whether an attempt that ended with `status` was refused, and why (empty: the ranks' own
// output says). A rank tells by its bye; before the monitor connects, the exit status 2 of
// pentad's refusals (cli/command.h) is all there is.
std::optional<std::string> refusal(int status, const Detector& detector) {
  bool started = false;
  for (const auto& [rank, r] : detector.ranks()) {
    if (r.bye == "refused") return r.bye_message;
    started = started || r.step > 0 || !r.history.empty();
  }
  if (status == 2 && !started) return std::string();
  return std::nullopt;
}

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

int Supervisor::run() {
  say(fmt::format("monitor at {}; job: {}", monitor_, fmt::join(o_.command, " ")));
  std::vector<std::string> command = o_.command;
  double prior_step_seconds = 0;
  for (int restarts = 0;; ++restarts) {
    Detector detector({o_.hang_factor, o_.hang_floor_s, o_.beat_timeout_s, prior_step_seconds});
    conn_rank_.clear();
    local_ranks_.clear();
    gone_since_.clear();
    const auto attempt_start = std::filesystem::file_time_type::clock::now();
    Job job(command,
            {{"PENTAD_MONITOR", monitor_}, {"PENTAD_LAUNCH_ATTEMPT", std::to_string(attempt_)}});
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
    if (end == End::kStopped) {
      say(fmt::format("signal {}: ending the job", int(g_stop_signal)));
      end_job(job, detector);
      return exit_with(128 + g_stop_signal, restarts);
    }
    end_job(job, detector);  // the ranks' beats meanwhile say how far they got
    if (detector.median_step_seconds() > 0) prior_step_seconds = detector.median_step_seconds();
    Recovery recovery{fault.detected_at, 0, -1, std::nullopt, 0};
    bool any = false;
    for (const auto& [rank, r] : detector.ranks()) {
      recovery.last_step = std::max(recovery.last_step, r.step);
      recovery.ckpt_step = any ? std::min(recovery.ckpt_step, r.ckpt_step) : r.ckpt_step;
      any = true;
    }
    // The beats say how far the ranks got, up to the last one before they ended; where the
    // launcher killed them all at once, steps shorter than a beat may have gone unseen.
    // Rank 0's metrics say it exactly, where this machine can read them.
    int64_t unseen = 0;
    const auto zero = detector.ranks().find(0);
    const int64_t logged = zero != detector.ranks().end() && local_ranks_.count(0)
                               ? last_logged_step(zero->second.out_dir, attempt_start)
                               : -1;
    if (logged >= 0)
      recovery.last_step = std::max(recovery.last_step, logged);
    else if (detector.median_step_seconds() > 0)
      unseen = int64_t(std::ceil(kBeatSeconds / detector.median_step_seconds())) + 1;
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
            wait_to_restart(decision, cause, detector, recovery.ckpt_step))
      return exit_with(*status, restarts);
    recovery_ = recovery;
    command = with_resume_latest(command);
    if (o_.exclude_culprit && !fault.culprit.empty()) command = without_a_replica(command);
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

// The backoff, then until every checkpoint directory the restart needs allows it (checked
// where this machine sees it: with ranks of its own). Returns the exit status when the
// supervisor gives up instead (a directory that did not clear, a stop signal).
std::optional<int> Supervisor::wait_to_restart(const RestartPolicy::Decision& decision,
                                               const std::string& cause, const Detector& detector,
                                               int64_t ckpt_step) {
  std::vector<std::string> dirs;  // train.ckpt_dir's, then the mirror's
  std::string failed_at;          // where the ranks' saves failed
  for (const auto& [rank, r] : detector.ranks()) {
    if (!local_ranks_.count(rank)) continue;
    if (dirs.empty()) dirs = r.ckpt_dirs;
    if (r.cause_kind == "checkpoint_save" && failed_at.empty()) failed_at = r.cause_path;
  }
  if (ckpt_step >= 0) committed_before_ = true;
  auto blocked = [&]() -> StoreCheck {
    if (!dirs.empty()) {
      StoreCheck c = check_store(dirs[0], {ckpt_step, committed_before_, failed_at == dirs[0]});
      if (!c.blocked.empty()) return c;
    }
    if (!failed_at.empty() && (dirs.empty() || failed_at != dirs[0]))
      return check_store(failed_at, {-1, false, true});
    return {};
  };
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
  double next_note = 0;
  for (;;) {
    if (g_stop_signal) {
      say(fmt::format("signal {}: not restarting", int(g_stop_signal)));
      return 128 + g_stop_signal;
    }
    const StoreCheck c = blocked();
    if (c.blocked.empty() && now() >= backoff_until) break;
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
      if (now() - start >= o_.storage_wait_s) {
        event({{"event", "waited"},
               {"why", c.blocked},
               {"seconds", now() - start},
               {"cleared", false}});
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
  return std::nullopt;
}

Supervisor::End Supervisor::run_attempt(Job& job, Detector& detector, Detection* fault) {
  auto on_line = [&](int conn, const std::string& line) { handle_line(conn, line, detector); };
  auto on_closed = [&](int conn) {
    auto it = conn_rank_.find(conn);
    if (it == conn_rank_.end()) return;
    detector.vanished(it->second, now());
    conn_rank_.erase(it);
  };
  for (;;) {
    if (g_stop_signal) return End::kStopped;
    server_.poll(0.05, on_line, on_closed);
    // A process gone whose connection lingers (another process holds its socket). A rank
    // that said bye and exited is gone before the bye and the connection's end are read:
    // the kernel closes a dead process's socket, so they follow unless the socket lingers,
    // and only then, kGoneGrace later, is the rank dead (from when it was first seen gone).
    for (int rank : local_ranks_) {
      const RankState& r = detector.ranks().at(rank);
      if (r.closed || !r.bye.empty() || process_alive(pid_t(r.pid))) {
        gone_since_.erase(rank);
        continue;
      }
      const double since = gone_since_.emplace(rank, now()).first->second;
      if (now() - since >= kGoneGrace) detector.vanished(rank, since);
    }
    if (const std::optional<int> status = job.poll()) {
      if (*status == 0) {
        // The ranks said bye before exiting: read what is still in flight, then judge.
        const double until = now() + 2.0;
        while (!conn_rank_.empty() && now() < until) server_.poll(0.05, on_line, on_closed);
        // Slowness seen only in the last beats (steps shorter than a beat: a whole slow
        // stretch can arrive with the bye) is still reported; the job is over, so no action.
        while (std::optional<Detection> d = detector.check(now()))
          if (d->slow()) report(*d, detector);
        if (detector.ranks().empty())
          say("the job finished, but no rank connected to the monitor (PENTAD_MONITOR): it ran "
              "unsupervised");
        else if (!detector.all_done())
          say("the job finished with status 0, though not every rank said bye \"done\"");
        else
          say("the job finished");
        return End::kDone;
      }
      // A refusal (an error before the first step: exit status 2, or a rank's bye
      // "refused") is the same on every attempt.
      if (const std::optional<std::string> why = refusal(*status, detector)) {
        fault->reason = *why;
        return End::kRefused;
      }
      // A rank's own report (its vanishing, its error) names a better culprit than the
      // launcher's status.
      std::optional<Detection> d = detector.check(now());
      if (!d || d->slow()) d = detector.launcher_failed(*status, now());
      report(*d, detector);
      *fault = *d;
      return End::kFault;
    }
    while (std::optional<Detection> d = detector.check(now())) {
      report(*d, detector);
      if (!d->slow() || o_.restart_on_slow) {
        *fault = *d;
        return End::kFault;
      }
    }
  }
}

void Supervisor::handle_line(int conn, const std::string& line, Detector& detector) {
  const json msg = json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool hello = msg.is_object() && msg.value("type", "") == "hello";
  if (!hello && !conn_rank_.count(conn)) return;  // nothing before a hello counts
  if (hello && msg.value("attempt", attempt_) != attempt_) {
    say(fmt::format("ignoring rank {} of attempt {} (this is attempt {})", msg.value("rank", -1),
                    msg.value("attempt", -1), attempt_));
    server_.drop(conn);
    return;
  }
  std::string error;
  const int rank = msg.is_discarded() ? -1 : detector.message(msg, now(), &error);
  if (rank < 0) {
    if (!warned_unreadable_)
      say("warning: unreadable monitor message (" + (error.empty() ? line : error) + ")");
    warned_unreadable_ = true;
    return;
  }
  const RankState& r = detector.ranks().at(rank);
  if (hello) {
    conn_rank_[conn] = rank;
    if (msg.contains("layout") && msg["layout"].is_object()) layout_ = msg["layout"];
    world_ = msg.value("world", world_);
    if (is_this_host(r.host)) local_ranks_.insert(rank);
    if (!r.out_dir.empty())
      events_.open((std::filesystem::path(r.out_dir) / "events.jsonl").string());
    if (recovery_ && !recovery_->hello_at) {
      recovery_->hello_at = now();
      recovery_->resume_step = r.resume_step;  // -1 until its "started"
    }
  }
  if (recovery_ && recovery_->resume_step < 0 && msg.value("type", "") == "started")
    recovery_->resume_step = r.resume_step;
  if (recovery_ && recovery_->hello_at && recovery_->resume_step >= 0 &&
      msg.value("type", "") == "beat" && r.step > recovery_->resume_step) {
    const double seconds = now() - recovery_->detected_at;
    // The steps trained again: from the step resumed at to the furthest step any rank had
    // finished before the job was ended (its beats up to the kill, end_job()).
    const int64_t redone = std::max<int64_t>(0, recovery_->last_step - recovery_->resume_step);
    event({{"event", "resumed"},
           {"resume_step", recovery_->resume_step},
           {"ckpt_step", recovery_->ckpt_step},
           {"reached_step", recovery_->last_step},
           {"steps_lost", redone},
           {"seconds_to_hello", *recovery_->hello_at - recovery_->detected_at},
           {"seconds_to_resume", seconds}});
    say(
        fmt::format("resumed at step {} ({} steps redone: step {} was reached before the fault), "
                    "{:.2f} s after the detection",
                    recovery_->resume_step, redone, recovery_->last_step, seconds));
    recovery_.reset();
  }
  if (msg.value("type", "") == "beat" && policy_.progressed(r.step)) {
    event({{"event", "cleared"}, {"step", r.step}});
    say(fmt::format("step {} reached: the failures in a row are cleared", r.step));
  }
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

void Supervisor::report(const Detection& d, const Detector& detector) {
  event({{"event", "detection"},
         {"class", d.cls},
         {"culprit", culprit_json(d.culprit)},
         {"latency_s", d.latency_s()},
         {"first_sign_t", d.first_sign_at},
         {"reason", d.reason},
         {"hang_threshold_s", detector.hang_threshold_s()},
         {"median_step_s", detector.median_step_seconds()}});
  say(fmt::format("detection: {}, {}, {:.1f} s after its first sign ({})", d.cls,
                  culprit_words(d.culprit), d.latency_s(), d.reason));
}

// Dump, then kill: the ranks on this machine write their communication traces on SIGUSR1
// (the evidence of what hung), then the whole job ends.
void Supervisor::end_job(Job& job, Detector& detector) {
  std::vector<pid_t> pids;
  for (int rank : local_ranks_) {
    const RankState& r = detector.ranks().at(rank);
    if (process_alive(pid_t(r.pid))) pids.push_back(pid_t(r.pid));
  }
  const double dump_at = now();
  std::vector<int> dumped;
  for (int rank : local_ranks_) {
    const RankState& r = detector.ranks().at(rank);
    if (!r.closed && process_alive(pid_t(r.pid)) && ::kill(pid_t(r.pid), SIGUSR1) == 0)
      dumped.push_back(rank);
  }
  // Keep reading meanwhile, so that no rank blocks on a full socket while it dumps, and so
  // that the steps the ranks finished (their beats, a few a step when steps are short) are
  // known to the end: the steps a restart redoes.
  if (!dumped.empty())
    while (now() < dump_at + 0.5)
      server_.poll(
          0.05, [&](int conn, const std::string& line) { handle_line(conn, line, detector); },
          [&](int conn) {
            auto it = conn_rank_.find(conn);
            if (it == conn_rank_.end()) return;
            detector.vanished(it->second, now());
            conn_rank_.erase(it);
          });
  event({{"event", "action"}, {"action", "dump"}, {"seconds", now() - dump_at}, {"ranks", dumped}});
  say(fmt::format("action: dump (SIGUSR1 to {} local ranks), {:.2f} s", dumped.size(),
                  now() - dump_at));

  const double kill_at = now();
  const bool forced = job.terminate(pids, 3.0);
  server_.drop_all();
  conn_rank_.clear();
  event({{"event", "action"},
         {"action", "kill"},
         {"seconds", now() - kill_at},
         {"forced", forced},
         {"launcher_status", job.poll().value_or(-1)}});
  say(fmt::format("action: kill ({}), {:.2f} s", forced ? "SIGKILL after 3 s" : "SIGTERM",
                  now() - kill_at));
}

}  // namespace

LaunchOptions parse_launch_options(int argc, char** argv) {
  LaunchOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc || std::string(argv[i + 1]) == "--")
        fail("pentad launch: {} needs a value", arg);
      return argv[++i];
    };
    if (arg == "--max-restarts")
      o.max_restarts = int(number(arg, value(), 0, 1000));
    else if (arg == "--backoff-s")
      o.backoff_s = number(arg, value(), 0, 3600);
    else if (arg == "--backoff-max-s")
      o.backoff_max_s = number(arg, value(), 0, 86400);
    else if (arg == "--storage-wait-s")
      o.storage_wait_s = number(arg, value(), 0, 86400);
    else if (arg == "--port")
      o.port = int(number(arg, value(), 0, 65535));
    else if (arg == "--hang-factor")
      o.hang_factor = number(arg, value(), 1, 1e6);
    else if (arg == "--hang-floor-s")
      o.hang_floor_s = number(arg, value(), 0.1, 1e6);
    else if (arg == "--beat-timeout-s")
      o.beat_timeout_s = number(arg, value(), 0.2, 1e6);
    else if (arg == "--events")
      o.events_path = value();
    else if (arg == "--restart-on-slow")
      o.restart_on_slow = true;
    else if (arg == "--exclude-culprit")
      o.exclude_culprit = true;
    else
      fail(
          "pentad launch: unknown option '{}' (pentad launch --help lists them; the job's "
          "command goes after --)",
          argv[i]);
  }
  for (++i; i < argc; ++i) o.command.push_back(argv[i]);
  if (o.command.empty())
    fail(
        "pentad launch: no job to run: put its command after --, e.g. pentad launch -- mpirun "
        "-np 4 pentad train recipes/gpt-tiny.toml");
  return o;
}

int supervise_main(int argc, char** argv) {
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    LaunchOptions options = parse_launch_options(argc, argv);
    // Ranks orphaned by a dead launcher come to us to be reaped (a zombie looks alive).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    struct sigaction stop {};
    stop.sa_handler = on_stop_signal;  // no SA_RESTART: poll() wakes up to see it
    ::sigaction(SIGINT, &stop, nullptr);
    ::sigaction(SIGTERM, &stop, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    Supervisor supervisor(std::move(options));
    return supervisor.run();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

}  // namespace pentad::launch
