// The Supervisor watching one attempt: the ranks' messages read as they come, the detector's
// findings reported (and acted on), local ranks whose process is gone found out, and the job
// ended: its ranks' traces dumped, then killed.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>

#include "launch/supervisor_internal.h"

namespace pentad::launch {

namespace {

using nlohmann::json;

// How long a local rank's process may be gone, its connection still open and no bye read,
// before it counts as dead: time for its last messages and end of connection to arrive from
// whatever still holds its socket (a rank's own process closes it as it dies, which is seen
// at once). 0.5 s was too little under CI's load once (2026-11-29: a child's bye sent 0.2 s
// after its parent's exit was not read within it).
constexpr double kGoneGrace = 2.0;
// After SIGTERM, how long the local ranks get to end before SIGKILL: each writes the survivors'
// state first (train/survivor_save.h), which under CI's load once took more than 3 s; mpirun's
// own grace is as long (supervisor_restart.cpp). Ranks that end sooner are not waited for.
constexpr double kEndGraceSeconds = 10.0;

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

}  // namespace

Supervisor::End Supervisor::run_attempt(Job& job, Detector& detector, Detection* fault) {
  for (;;) {
    if (g_stop_signal) return End::kStopped;
    read_ranks(detector);
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
    if (const std::optional<int> status = job.poll()) return finished(*status, detector, fault);
    if (grow_due(detector)) return End::kGrow;
    while (std::optional<Detection> d = detector.check(now())) {
      report(*d, detector);
      if (d->cls == "host unreachable" && link_came_back(*d, job, detector)) {
        detector.rearm(now());
        continue;
      }
      if (o_.replan && d->cls == "comm slow" && d->culprit.size() == 2) {
        if (around_slow_link(*d, detector)) return End::kReplan;
        continue;
      }
      if (!d->slow() || o_.restart_on_slow) {
        *fault = *d;
        return End::kFault;
      }
    }
  }
}

// The launcher exited with `status`: the job is done, was refused, or failed (*fault).
Supervisor::End Supervisor::finished(int status, Detector& detector, Detection* fault) {
  if (status == 0) {
    // The ranks said bye before exiting: read what is still in flight, then judge.
    const double until = now() + 2.0;
    while (!conn_rank_.empty() && now() < until) read_ranks(detector);
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
  if (const std::optional<std::string> why = refusal(status, detector)) {
    fault->reason = *why;
    return End::kRefused;
  }
  // A rank's own report (its vanishing, its error) names a better culprit than the
  // launcher's status.
  std::optional<Detection> d = detector.check(now());
  if (!d || d->slow()) d = detector.launcher_failed(status, now());
  report(*d, detector);
  *fault = *d;
  return End::kFault;
}

// The ranks' messages and ended connections of up to 50 ms.
void Supervisor::read_ranks(Detector& detector) {
  server_.poll(
      0.05, [&](int conn, const std::string& line) { handle_line(conn, line, detector); },
      [&](int conn) { on_closed(conn, detector); });
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
    if (attempt_ == 0) full_world_ = std::max(full_world_, msg.value("world", 0));
    if (msg.contains("layout") && msg["layout"].is_object()) layout_ = msg["layout"];
    world_ = msg.value("world", world_);
    if (is_this_host(r.host)) local_ranks_.insert(rank);
    if (!r.out_dir.empty())
      events_.open((std::filesystem::path(r.out_dir) / "events.jsonl").string());
  }
  if (recovery_) note_recovery(msg, hello, r);
  if (measure_ && msg.value("type", "") == "beat") note_measured(r, detector);
  if (!first_step_at_ && msg.value("type", "") == "beat" && r.step > r.resume_step)
    first_step_at_ = now();
  if (msg.value("type", "") == "beat" && policy_.progressed(r.step)) {
    event({{"event", "cleared"}, {"step", r.step}});
    say(fmt::format("step {} reached: the failures in a row are cleared", r.step));
  }
}

// A restarted job's way back, from rank r's message: its first hello, the step it resumed at,
// and the first beat past that step, which ends the recovery ("resumed").
void Supervisor::note_recovery(const json& msg, bool hello, const RankState& r) {
  if (hello && !recovery_->hello_at) {
    recovery_->hello_at = now();
    recovery_->resume_step = r.resume_step;  // -1 until its "started"
  }
  if (recovery_->resume_step < 0 && msg.value("type", "") == "started")
    recovery_->resume_step = r.resume_step;
  if (!recovery_->hello_at || recovery_->resume_step < 0 || msg.value("type", "") != "beat" ||
      r.step <= recovery_->resume_step)
    return;
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
  if (measure_) measure_->from_step = recovery_->resume_step;
  say(
      fmt::format("resumed at step {} ({} steps redone: step {} was reached before the fault), "
                  "{:.2f} s after the detection",
                  recovery_->resume_step, redone, recovery_->last_step, seconds));
  recovery_.reset();
}

// A connection ended: its rank, if it said hello, has vanished.
void Supervisor::on_closed(int conn, Detector& detector) {
  auto it = conn_rank_.find(conn);
  if (it == conn_rank_.end()) return;
  detector.vanished(it->second, now());
  conn_rank_.erase(it);
}

// Waits (reading the ranks meanwhile) until every rank of the silent host has been heard
// within the beat timeout and every rank has finished a step past the furthest step at the
// detection: the link came back and the job moves on (each of its connections recovers at
// its transport's next retransmission after the link is back, so some take longer than the
// beats' own). Up to --link-wait-s.
bool Supervisor::link_came_back(const Detection& d, Job& job, Detector& detector) {
  if (o_.link_wait_s <= 0) return false;
  int64_t reached = 0;
  for (const auto& [rank, r] : detector.ranks()) reached = std::max(reached, r.step);
  const double start = now();
  event({{"event", "wait"},
         {"why", "host_link"},
         {"host", d.host},
         {"step", reached},
         {"timeout_s", o_.link_wait_s}});
  say(fmt::format("waiting up to --link-wait-s {} for host {} to be heard again", o_.link_wait_s,
                  d.host));
  auto heard_and_moving = [&] {
    for (const auto& [rank, r] : detector.ranks())
      if (r.closed || r.step <= reached ||
          (r.host == d.host && now() - r.last_heard_at > o_.beat_timeout_s))
        return false;
    return !detector.ranks().empty();
  };
  bool back = false;
  while (!g_stop_signal && now() - start < o_.link_wait_s && !job.poll()) {
    read_ranks(detector);
    if ((back = heard_and_moving())) break;
  }
  event({{"event", "waited"},
         {"why", "host_link"},
         {"host", d.host},
         {"seconds", now() - start},
         {"cleared", back}});
  say(back ? fmt::format("host {} is heard again after {:.1f} s and the job moves on: no "
                         "restart",
                         d.host, now() - start)
           : fmt::format("host {} still unreachable after {:.1f} s", d.host, now() - start));
  return back;
}

void Supervisor::report(const Detection& d, const Detector& detector) {
  json e{{"event", "detection"},
         {"class", d.cls},
         {"culprit", culprit_json(d.culprit)},
         {"latency_s", d.latency_s()},
         {"first_sign_t", d.first_sign_at},
         {"reason", d.reason},
         {"hang_threshold_s", detector.hang_threshold_s()},
         {"median_step_s", detector.median_step_seconds()}};
  if (!d.host.empty()) e["host"] = d.host;
  if (!d.peer_host.empty()) e["peer_host"] = d.peer_host;
  event(e);
  say(fmt::format("detection: {}, {}, {:.1f} s after its first sign ({})", d.cls,
                  culprit_words(d.culprit), d.latency_s(), d.reason));
}

// Dump, then kill: the ranks on this machine write their communication traces on SIGUSR1
// (the evidence of what hung), then the whole job ends. No dump where nothing went wrong
// (growing back): the sooner the kill, the fewer steps past the checkpoint are redone.
void Supervisor::dump_traces(Detector& detector) {
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
    while (now() < dump_at + 0.5) read_ranks(detector);
  event({{"event", "action"}, {"action", "dump"}, {"seconds", now() - dump_at}, {"ranks", dumped}});
  say(fmt::format("action: dump (SIGUSR1 to {} local ranks), {:.2f} s", dumped.size(),
                  now() - dump_at));
}

void Supervisor::end_job(Job& job, Detector& detector, bool dump) {
  std::vector<pid_t> pids;
  for (int rank : local_ranks_) {
    const RankState& r = detector.ranks().at(rank);
    if (process_alive(pid_t(r.pid))) pids.push_back(pid_t(r.pid));
  }
  if (dump) dump_traces(detector);
  const double kill_at = now();
  const bool forced = job.terminate(pids, kEndGraceSeconds);
  server_.drop_all();
  conn_rank_.clear();
  event({{"event", "action"},
         {"action", "kill"},
         {"seconds", now() - kill_at},
         {"forced", forced},
         {"launcher_status", job.poll().value_or(-1)}});
  say(fmt::format("action: kill ({}), {:.2f} s",
                  forced ? fmt::format("SIGKILL after {:.0f} s", kEndGraceSeconds) : "SIGTERM",
                  now() - kill_at));
}

}  // namespace pentad::launch
