#pragma once
// The Supervisor behind `pentad launch` (supervisor.h), shared by the files it is written in:
// supervisor.cpp (the command line, signals), supervisor_restart.cpp (the restart loop, and
// the wait before a restart), supervisor_watch.cpp (one attempt watched: the ranks' messages,
// detections, ending the job). Nothing outside them includes it.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launch/detector.h"
#include "launch/event_log.h"
#include "launch/host_check.h"
#include "launch/job.h"
#include "launch/monitor_server.h"
#include "launch/replan.h"
#include "launch/restart_policy.h"
#include "launch/store_check.h"
#include "launch/supervisor.h"

namespace pentad::launch {

// The stop signal (SIGINT, SIGTERM) caught, 0 while none: the job is ended, not restarted.
extern volatile std::sig_atomic_t g_stop_signal;
// SIGUSR2 caught: the ranks a --replan restart left out are back (grow at the next checkpoint).
extern volatile std::sig_atomic_t g_grow_signal;

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options);

  int run();

 private:
  // From a fault to the restarted job's first progress.
  struct Recovery {
    double detected_at = 0;
    int64_t last_step = 0, ckpt_step = -1;
    std::optional<double> hello_at;
    int64_t resume_step = 0;
  };
  enum class End { kDone, kFault, kStopped, kRefused, kGrow, kReplan };

  // supervisor_restart.cpp
  Recovery how_far(const Detection& fault, const Detector& detector,
                   std::filesystem::file_time_type attempt_start, int64_t* unseen) const;
  std::optional<int> wait_to_restart(const RestartPolicy::Decision& decision,
                                     const std::string& cause, const Detector& detector,
                                     int64_t ckpt_step, const Detection& fault);
  int give_up_waiting(const StoreCheck& c, double start);
  int give_up_on_host(const std::string& host, double start);
  std::vector<std::string> without_a_replica(const std::vector<std::string>& command);
  // supervisor_replan.cpp
  void ensure_calibration();
  std::optional<std::vector<std::string>> replanned(const std::vector<std::string>& command,
                                                    const Detection& fault);
  void note_measured(const RankState& r, const Detector& detector);
  bool grow_due(const Detector& detector);
  std::vector<std::string> grown(const std::vector<std::string>& command);
  // A slow link under --replan: true when the job is to restart on the layout re-planned
  // around it (slow_command_), false when it goes on as it is (the event log says why).
  bool around_slow_link(const Detection& d, const Detector& detector);
  void adopt(const Replan& r);

  // supervisor_watch.cpp
  End run_attempt(Job& job, Detector& detector, Detection* fault);
  End finished(int status, Detector& detector, Detection* fault);
  void read_ranks(Detector& detector);
  void handle_line(int conn, const std::string& line, Detector& detector);
  void on_closed(int conn, Detector& detector);
  void note_recovery(const nlohmann::json& msg, bool hello, const RankState& r);
  void report(const Detection& d, const Detector& detector);
  void end_job(Job& job, Detector& detector, bool dump = true);
  void dump_traces(Detector& detector);
  // A host unreachable: up to --link-wait-s for its ranks to be heard again and the job to
  // move on. True: it did (the job goes on); false: it did not, or the job ended meanwhile.
  bool link_came_back(const Detection& d, Job& job, Detector& detector);

  void sleep_a_tick() {
    server_.poll(
        0.1, [](int, const std::string&) {}, [](int) {});
  }
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void event(nlohmann::json e) {
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
  nlohmann::json layout_;             // the mesh degrees and batch the ranks reported (hello)
  int world_ = 0;
  bool warned_unreadable_ = false;
  RestartPolicy policy_;
  bool committed_before_ = false;  // some attempt reported a checkpoint committed (ckpt_step)
  std::optional<Recovery> recovery_;
  // After a re-plan: the new layout's predicted step, measured once its ranks have run
  // kMeasureSteps steps past the step they resumed at ("measured" event).
  struct PendingMeasure {
    std::string layout;
    double predicted_s = 0;
    int64_t from_step = -1;  // -1: not yet resumed
  };
  std::optional<PendingMeasure> measure_;
  std::vector<std::string> command_;       // the attempt's job command
  double attempt_at_ = 0;                  // when the attempt started
  std::optional<double> first_step_at_;    // when a rank first reported a step past its resume
  std::vector<std::string> slow_command_;  // around_slow_link's command for the restart
  Detection slow_fault_;                   // ... and the detection it answers
  int full_world_ = 0;            // the first attempt's world: what growing back returns to
  int64_t grow_after_ckpt_ = -2;  // growing: the checkpoint step to pass (-2: not growing)
};

}  // namespace pentad::launch
