#pragma once
// The in-rank side of `pentad launch`'s fault detection: a thread that streams this rank's
// activity (parallel/activity.h) to the supervisor over TCP, newline-delimited JSON:
//   {"type":"hello","rank","world","pid","host","out_dir","attempt","resume_step":-1}  at once;
//   {"type":"started","rank","resume_step"}  when training starts (after any resume);
//   {"type":"beat","rank","t","step","phase","step_seconds","wait_seconds","ckpt_step",
//     "recent":[[step, seconds, wait seconds, compute CPU seconds], ...],
//     "wait":{"comm","kind","seq","since_s","members"}}  every beat_ms (wait: only while
//     blocked in a collective; recent: the last 16 steps);
//   {"type":"bye","rank","status":"done"|"error"|"terminated","message"}  at the end
//     (terminated: SIGTERM, from mpirun ending the job after another rank died).
// The beats come from their own thread, so a rank that computes keeps beating, a rank
// blocked in a collective says which, and a stopped or dead one goes silent: that, against
// the others' waits, is what the supervisor (launch/supervisor.h) decides from.
// Monitoring is optional: without PENTAD_MONITOR (host:port) nothing starts, and a
// supervisor that cannot be reached costs one warning, never the run.
#include <atomic>
#include <string>
#include <thread>

namespace pentad::launch {

class Monitor {
 public:
  Monitor(int world_rank, int world_size, std::string out_dir, int beat_ms = 100);
  ~Monitor();  // stops the thread; says bye "error" unless finish() said otherwise
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  void finish(bool ok, const std::string& message = "");
  bool connected() const { return fd_ >= 0; }

 private:
  void run();
  bool send_line(const std::string& line);  // false once the connection is gone

  int rank_ = 0, world_ = 1;
  std::string out_dir_;
  int beat_ms_ = 100;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> said_bye_{false};
  std::thread thread_;
};

}  // namespace pentad::launch
