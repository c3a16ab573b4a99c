#include "train/survivor_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "core/check.h"

namespace pentad {

namespace {

int g_wake = -1;  // the pipe's write end; write() is async-signal-safe
struct sigaction g_previous {};

void on_terminate(int) {
  const char wake = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_wake, &wake, 1);
}

}  // namespace

SurvivorSave::SurvivorSave(std::function<void()> write) : write_(std::move(write)) {
  PENTAD_CHECK(g_wake < 0, "one SurvivorSave at a time");
  if (::pipe2(pipe_, O_CLOEXEC) != 0)
    fail("survivors' state: pipe2 failed: {}", std::strerror(errno));
  g_wake = pipe_[1];
  thread_ = std::thread([this] { run(); });
  struct sigaction act {};
  act.sa_handler = on_terminate;
  sigemptyset(&act.sa_mask);
  ::sigaction(SIGTERM, &act, &g_previous);
}

SurvivorSave::~SurvivorSave() {
  ::sigaction(SIGTERM, &g_previous, nullptr);
  const char stop = 0;
  [[maybe_unused]] const ssize_t n = ::write(pipe_[1], &stop, 1);
  thread_.join();
  g_wake = -1;
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

void SurvivorSave::run() {
  char why = 0;
  while (::read(pipe_[0], &why, 1) < 0 && errno == EINTR) {
  }
  if (why != 1) return;
  write_();
  // SIGTERM as it was handled before: the monitor's goodbye, or the default.
  ::sigaction(SIGTERM, &g_previous, nullptr);
  ::kill(::getpid(), SIGTERM);
}

}  // namespace pentad
