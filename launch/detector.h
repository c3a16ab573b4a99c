#pragma once
// The supervisor's judgement, without sockets or processes (C4D's idea: the ranks' own
// communication tells which one stalls the others). Fed the ranks' monitor messages (hello,
// beat, bye: the protocol in launch/supervisor.h) with the supervisor's clock at receipt; asked
// at each tick whether a fault is visible. Thresholds come from the run (its median step
// time), not from fixed minutes. Times are seconds on the supervisor's clock.
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pentad::launch {

struct DetectorOptions {
  double hang_factor = 5.0;       // a wait longer than this x the median step time is a hang
  double hang_floor_s = 2.0;      // ... and never shorter than this (x 5 before any step ends)
  double beat_timeout_s = 1.0;    // a rank silent this long is unresponsive
  double prior_step_seconds = 0;  // median step time of an earlier attempt (0: none)
  double link_slow_s = 1.0;       // a link slow this long (and kLinkSteps steps) is reported
};

// A collective a rank is blocked in. `members` are world ranks of its communicator.
struct Wait {
  std::string comm, kind;
  int64_t seq = 0;
  std::vector<int> members;
  double entered_at = 0;  // the rank's beat time minus since_s, moved to our clock
};

struct StepRecord {
  int64_t step = 0;
  double step_seconds = 0, wait_seconds = 0;
  double seen_at = 0;
  double compute_cpu = -1;  // the rank's CPU seconds outside waits (-1: not reported)
};

struct RankState {
  int64_t pid = 0;
  std::string host, out_dir;
  int64_t resume_step = 0;
  bool closed = false;  // connection gone, or its process gone
  double closed_at = 0;
  std::string bye;  // "", "done", "error", "refused" or "terminated"
  std::string bye_message;
  std::string cause_kind, cause_path;  // the bye's cause, launch/monitor.h (may be empty)
  std::vector<std::string> ckpt_dirs;  // the hello's: train.ckpt_dir's, then the mirror's
  double last_heard_at = 0;            // hello or last beat
  std::string phase = "other";
  int64_t step = 0, ckpt_step = -1;
  std::optional<Wait> wait;
  std::deque<StepRecord> history;  // newest last, at most kHistorySteps
  // The attempt's first kEarlySteps steps after its first (warm-up): what the steps took
  // before a fault that came later than history reaches back.
  std::vector<StepRecord> early;
  // Its row of the link matrix (beats' "p2p", parallel/activity.h): peer -> seconds per MB
  // of its recent sends to it, and of its receives from it.
  std::map<int, double> send_s_per_mb, recv_s_per_mb;
  // Per communicator: the highest collective seen complete (beats' "done") and when that
  // number last grew.
  struct Done {
    int64_t seq = -1;
    double since = 0;
  };
  std::map<std::string, Done> done;
};

struct Detection {
  Detection() = default;
  Detection(std::string cls_, std::vector<int> culprit_, double first_sign, double detected,
            std::string reason_)
      : cls(std::move(cls_)),
        culprit(std::move(culprit_)),
        first_sign_at(first_sign),
        detected_at(detected),
        reason(std::move(reason_)) {}
  // dead, non-comm hang, comm hang, non-comm slow, comm slow; with ranks on several hosts
  // also host down (every rank of one host gone at once) and host unreachable (every rank of
  // one host silent at once while the others' beats arrive: its link, or the host stuck)
  std::string cls;
  std::vector<int> culprit;  // one rank; or the members of a wait that no member blocks
  double first_sign_at = 0, detected_at = 0;
  std::string reason;
  std::string host;       // the host at fault (host down, host unreachable), or a link's end
  std::string peer_host;  // the link's other end, between two hosts (comm slow, comm hang)
  double factor = 0;      // comm slow: how many times its like's seconds per MB the link took
  bool slow() const { return cls == "non-comm slow" || cls == "comm slow"; }
  bool host_fault() const { return cls == "host down" || cls == "host unreachable"; }
  double latency_s() const { return detected_at - first_sign_at; }
};

class Detector {
 public:
  static constexpr size_t kHistorySteps = 20;  // median step time over this many steps
  static constexpr size_t kEarlySteps = 5;     // RankState::early
  // A rank blocked on its checkpoint's disk work is named as a hang only after this many
  // times the hang threshold, and at least this many seconds.
  static constexpr double kCheckpointHangFactor = 10;
  static constexpr double kCheckpointHangSeconds = 30;
  // A slow rank must be slow this many steps running: on a shared, oversubscribed machine a
  // rank descheduled for 5 steps of 15 ms happened in a clean run; 10 did not in 200 steps.
  static constexpr size_t kSlowSteps = 10;
  // ... and for at least this long: its steps' seconds over those steps, or the time since
  // the first slow step of a window that every check since found slow too. With steps of a
  // few milliseconds, 10 steps of a rank on a VM's stolen core (0.15 s) came in clean runs
  // (2026-11-30, twice), and so did half a second of a rank computing 2x the others' CPU time
  // (the local CI of 2026-11-30: the VM's vCPUs ran identical passes up to 2x apart that day);
  // a rank slow at its work stays so.
  static constexpr double kSlowSeconds = 2.0;
  // A slow link: a pair at this many times the median pair's seconds per MB ...
  static constexpr double kLinkFactor = 3.0;
  // ... for this long (x the median step time, and at least DetectorOptions::link_slow_s)
  // running.
  static constexpr double kLinkSteps = 10;
  // A rank not heard from for this long (5 beats) is not judged by its links: a stopped
  // process's peers see their transfers with it stall, which is the hang rules' case.
  static constexpr double kLinkSilentSeconds = 0.5;
  // Links are not judged while a collective has waited this long (and twice the median
  // step): a hang in the making stalls transfers.
  static constexpr double kLinkStallSeconds = 0.5;
  // A pair between two hosts is judged against its own first samples too: a link between
  // hosts is slower than one inside a host by nature, and a throttled host link slows every
  // pair across it at once, so neither the median pair nor its like can be the measure.
  static constexpr size_t kLinkBaselineSamples = 20;
  // A rank gone while others of its host are not yet: how long to wait for them before
  // naming the rank alone (a killed host's ranks close within milliseconds of each other).
  static constexpr double kHostWindowSeconds = 0.5;
  // A wait in a collective that a member reports completed (its "done" at or past it) is
  // stale for this long after that report: no hang is judged meanwhile (beats are 100 ms
  // apart). Bounded, in case a communicator's numbers do not line up across ranks (its sends
  // and receives are numbered too).
  static constexpr double kStaleWaitSeconds = 1.0;

  explicit Detector(DetectorOptions options) : options_(options) {}

  // One protocol message; returns its rank, or -1 (with `error` set) for a malformed one.
  int message(const nlohmann::json& msg, double now, std::string* error);
  // The rank's connection closed, or its pid is gone.
  void vanished(int rank, double now);
  // The launcher exited with this status (nonzero) while the job ran.
  Detection launcher_failed(int status, double now) const;

  // The first fault visible now that was not reported before: fatal ones (dead, hang) first,
  // then slow ones (each kind reported once).
  std::optional<Detection> check(double now);

  // After a fatal detection that cleared by itself (a host heard again, launch/supervisor.h):
  // fatal faults are looked for again, and waits already under way count from `now` (a
  // collective held up by the outage may need the transport's next retransmission to finish).
  void rearm(double now) {
    fatal_reported_ = false;
    waits_from_ = now;
  }

  double median_step_seconds() const;  // 0 before any step
  double hang_threshold_s() const;
  // Every rank said hello and bye "done".
  bool all_done() const;
  const std::map<int, RankState>& ranks() const { return ranks_; }
  int world() const { return world_; }

 private:
  std::optional<Detection> check_dead(double now) const;
  std::optional<Detection> check_hang(double now) const;
  bool stale(const Wait& w, double now) const;  // kStaleWaitSeconds
  std::optional<Detection> check_silent(double now) const;
  std::optional<Detection> check_compute_slow(double now);
  std::optional<Detection> check_link_slow(double now);
  bool silent(const RankState& r, double now) const;
  // Ranks on more than one host (the hello's "host"): the host rules apply.
  bool several_hosts() const;
  std::vector<int> ranks_of(const std::string& host) const;
  // `d` as a host fault when its culprit's host has every rank gone or silent while another
  // host's ranks are heard; else `d` with the hosts of a link named.
  Detection on_hosts(Detection d, double now) const;

  DetectorOptions options_;
  std::map<int, RankState> ranks_;
  // check_compute_slow(): the rank slow over every check running, and since when (the
  // first slow step of its first slow window); -1: none.
  int slow_rank_ = -1;
  double slow_since_ = 0;
  int world_ = 0;
  double waits_from_ = 0;  // no wait counts from before this (rearm())
  bool fatal_reported_ = false, compute_slow_reported_ = false, link_slow_reported_ = false;
  std::map<std::pair<int, int>, double> link_slow_since_;  // pair -> first seen slow, until not
  std::map<std::pair<int, int>, std::vector<double>> link_first_;  // pair -> its first samples
};

}  // namespace pentad::launch
