#pragma once
// The supervised job as a process: the launcher command (mpirun ... pentad train ...) started
// in a process group of its own so that it can be ended as a whole, its exit seen without
// blocking, and the command rewritten for a restart from the newest checkpoint.
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pentad::launch {

class Job {
 public:
  // Starts `command` (argv[0] looked up on PATH) with `env` added to this environment.
  // Throws pentad::Error naming the command when it cannot be started.
  Job(const std::vector<std::string>& command,
      const std::vector<std::pair<std::string, std::string>>& env);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job();  // ends the group if still running (the supervisor is leaving)

  // The launcher's exit status once it has exited (128 + signal when killed); nullopt while
  // it runs. Never blocks.
  std::optional<int> poll();

  // SIGTERM to the group and to `pids` (ranks that may sit in groups of their own), SIGCONT
  // so that stopped ones act on it, SIGKILL after `grace_s`. Returns true when SIGKILL
  // was needed. Waits for the launcher.
  bool terminate(const std::vector<pid_t>& pids, double grace_s);

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The command of the next attempt: `--resume latest` appended (the train arguments are the
// command's last words), or the value of an existing --resume / --resume=X replaced.
std::vector<std::string> with_resume_latest(std::vector<std::string> command);

// True when a process with this pid exists on this machine and is no zombie.
bool process_alive(pid_t pid);

}  // namespace pentad::launch
