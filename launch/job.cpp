#include "launch/job.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/check.h"

namespace pentad::launch {

namespace {

int decode(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

void signal_all(pid_t group, const std::vector<pid_t>& pids, int sig) {
  if (group > 0) ::kill(-group, sig);
  for (pid_t p : pids)
    if (p > 0) ::kill(p, sig);
}

}  // namespace

Job::Job(const std::vector<std::string>& command,
         const std::vector<std::pair<std::string, std::string>>& env) {
  PENTAD_CHECK(!command.empty());
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // A close-on-exec pipe carries exec's errno back: an exec that fails is a user error to
  // report, not a job that died (restarting it would fail the same way).
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) fail("pentad launch: pipe: {}", std::strerror(errno));
  pid_ = ::fork();
  if (pid_ < 0) fail("pentad launch: fork: {}", std::strerror(errno));
  if (pid_ == 0) {
    ::setpgid(0, 0);
    // The supervisor's own signal dispositions must not leak into the job.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    for (const auto& [key, value] : env) ::setenv(key.c_str(), value.c_str(), 1);
    ::execvp(argv[0], argv.data());
    const int err = errno;
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first, the group exists before a kill
  ::close(report[1]);
  int err = 0;
  const ssize_t n = ::read(report[0], &err, sizeof err);
  ::close(report[0]);
  if (n == sizeof err) {
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    fail(
        "pentad launch: cannot run '{}': {} (the command after -- must be a program, e.g. "
        "mpirun)",
        command[0], std::strerror(err));
  }
}

Job::~Job() {
  if (pid_ > 0 && !poll()) terminate({}, 3.0);
}

std::optional<int> Job::poll() {
  // Reaps every child: with the supervisor a subreaper (supervisor.cpp), ranks orphaned by a
  // dead launcher come to it, and a zombie would still look alive to kill(pid, 0).
  int wstatus = 0;
  pid_t r;
  while ((r = ::waitpid(-1, &wstatus, WNOHANG)) > 0)
    if (r == pid_) status_ = decode(wstatus);
  return status_;
}

bool Job::terminate(const std::vector<pid_t>& pids, double grace_s) {
  // SIGTERM first, then SIGCONT: a stopped process keeps SIGTERM pending until continued.
  signal_all(pid_, pids, SIGTERM);
  signal_all(pid_, pids, SIGCONT);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  // With the ranks known, they are what is waited for: mpirun, told to end them, waits its
  // own odls_base_sigkill_timeout before it reaps them (10 s under pentad launch), and is
  // killed at once when they have ended.
  auto any_alive = [&] {
    bool alive = pids.empty() && !poll().has_value();
    for (pid_t p : pids) alive = alive || process_alive(p);
    return alive;
  };
  while (any_alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bool forced = false;
  if (any_alive()) {
    forced = true;
    signal_all(pid_, pids, SIGKILL);
  } else if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // stragglers of the group that ignored SIGTERM (best effort)
  }
  if (!status_ && pid_ > 0) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, 0) == pid_) status_ = decode(wstatus);
  }
  return forced;
}

std::vector<std::string> with_resume_latest(std::vector<std::string> command) {
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == "--resume" && i + 1 < command.size()) {
      command[i + 1] = "latest";
      return command;
    }
    if (command[i].rfind("--resume=", 0) == 0) {
      command[i] = "--resume=latest";
      return command;
    }
  }
  command.push_back("--resume");
  command.push_back("latest");
  return command;
}

bool process_alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) return false;
  // A zombie has ended: only its parent (the launcher, which may take its time) reaps it.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

}  // namespace pentad::launch
