#pragma once
// The in-rank side of `pentad launch`'s fault detection: a thread that streams this rank's
// activity (parallel/activity.h) to the supervisor over TCP, newline-delimited JSON:
//   {"type":"hello","rank","world","pid","host","out_dir","attempt","resume_step":-1,
//    "layout":{"dp","tp","cp","pp","ep","etp","micro_batch","grad_accum"},
//    "ckpt_dirs":[absolute paths: train.ckpt_dir's, then the mirror's]}  at once;
//   {"type":"started","rank","resume_step"}  when training starts (after any resume);
//   {"type":"beat","rank","t","step","phase","step_seconds","wait_seconds","ckpt_step",
//     "recent":[[step, seconds, wait seconds, compute CPU seconds], ...],
//     "wait":{"comm","kind","seq","since_s","members"}}  every beat_ms (wait: only while
//     blocked in a collective; recent: the last 16 steps; phase: "wait" in a collective,
//     "checkpoint" blocked on the checkpoint's disk work, "compute" otherwise once
//     training has started, "other" before);
//   {"type":"bye","rank","status":"done"|"error"|"refused"|"terminated","message",
//    "cause":{"kind","path"}}  at the end (refused: an error before the first step, which a
//     restart would meet again; terminated: SIGTERM, from mpirun ending the job after
//     another rank died; cause, with some errors: what the supervisor can check before it
//     restarts, launch/store_check.h).
// The beats come from their own thread, so a rank that computes keeps beating, a rank
// blocked in a collective says which, and a stopped or dead one goes silent: that, against
// the others' waits, is what the supervisor (launch/supervisor.h) decides from.
// Monitoring is optional: without PENTAD_MONITOR (host:port) nothing starts, and a
// supervisor that cannot be reached costs one warning, never the run.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace pentad::launch {

// What the hello tells of the job's layout, for --exclude-culprit (launch/exclude.h).
struct MonitorLayout {
  int dp = 1, tp = 1, cp = 1, pp = 1, ep = 1, etp = 1;
  int64_t micro_batch = 0, grad_accum = 1;
};

// An error's cause that the supervisor can check: kind "checkpoint_save", saves that failed
// at the checkpoint directory `path` (a full or missing file system).
struct ByeCause {
  std::string kind, path;
};

class Monitor {
 public:
  Monitor(int world_rank, int world_size, std::string out_dir, int beat_ms = 100,
          MonitorLayout layout = {}, std::vector<std::string> ckpt_dirs = {});
  ~Monitor();  // stops the thread; says bye "error" unless finish() said otherwise
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  // The bye: "done" when ok, else "error", or "refused" for an error before the first step.
  void finish(bool ok, const std::string& message = "", bool refused = false,
              const ByeCause& cause = {});
  bool connected() const { return fd_ >= 0; }

 private:
  void run();
  bool send_line(const std::string& line);  // false once the connection is gone

  int rank_ = 0, world_ = 1;
  std::string out_dir_;
  int beat_ms_ = 100;
  MonitorLayout layout_;
  std::vector<std::string> ckpt_dirs_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> said_bye_{false};
  std::thread thread_;
};

}  // namespace pentad::launch
