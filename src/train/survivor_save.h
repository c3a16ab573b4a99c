#pragma once
// The survivors' state on SIGTERM (checkpoint/checkpoint.h, write_survivor): after one rank of
// a job died, mpirun ends the others with SIGTERM (then, a second later, SIGKILL: Open MPI's
// odls_base_sigkill_timeout), and pentad launch ends a job with SIGTERM too. While a
// SurvivorSave lives, SIGTERM wakes a thread of its own that runs `write` (the Trainer's:
// CheckpointManager::write_survivor_state), then lets SIGTERM take the course it had before
// (the fault monitor's goodbye, then the default: the process ends). The training thread
// goes on meanwhile, most often blocked in a collective with the rank that died.
#include <functional>
#include <thread>

namespace pentad {

class SurvivorSave {
 public:
  explicit SurvivorSave(std::function<void()> write);
  ~SurvivorSave();  // SIGTERM's handling as it was; the thread ended
  SurvivorSave(const SurvivorSave&) = delete;
  SurvivorSave& operator=(const SurvivorSave&) = delete;

 private:
  void run();

  std::function<void()> write_;
  int pipe_[2] = {-1, -1};  // the handler writes 1 (SIGTERM), the destructor 0
  std::thread thread_;
};

}  // namespace pentad
