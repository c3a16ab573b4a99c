// The rank side of fault detection: the monitor thread streams what the training thread
// publishes (parallel/activity.h) to PENTAD_MONITOR. A local TCP listener stands in for the
// supervisor; the training thread steps and blocks in a "collective" while the monitor
// beats (run under ThreadSanitizer in scripts/sanitize.sh: the two threads share no lock).
#include "launch/monitor.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "parallel/activity.h"

using namespace pentad;
using nlohmann::json;

namespace {

// Accepts one connection and collects its lines until it closes.
struct Listener {
  int fd = -1, port = 0;
  std::vector<json> lines;
  std::thread thread;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    listen(fd, 1);
    thread = std::thread([this] {
      const int c = accept(fd, nullptr, nullptr);
      std::string buffer;
      char chunk[4096];
      for (ssize_t n; (n = read(c, chunk, sizeof(chunk))) > 0;) buffer.append(chunk, size_t(n));
      close(c);
      for (size_t at = 0, end; (end = buffer.find('\n', at)) != std::string::npos; at = end + 1)
        lines.push_back(json::parse(buffer.substr(at, end - at)));
    });
  }
  ~Listener() {
    if (thread.joinable()) thread.join();
    close(fd);
  }
};

}  // namespace

TEST(Monitor, BeatsSayWhereTheRankIsBlockedAndHowFarItCame) {
  Listener supervisor;
  setenv("PENTAD_MONITOR", ("127.0.0.1:" + std::to_string(supervisor.port)).c_str(), 1);
  parallel::CommTraceChannel* dp = parallel::trace_open_channel("dp_test");
  parallel::trace_set_members(dp, {0, 3});
  {
    launch::Monitor monitor(3, 4, "runs/test", /*beat_ms=*/5);
    ASSERT_TRUE(monitor.connected());
    parallel::activity_run_started(7);
    for (int64_t step = 8; step <= 20; ++step) {  // the training thread: steps ...
      parallel::activity_step_done(step, 0.002);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // ... then blocks in dp's all-gather #42
    const parallel::TraceTicket ticket =
        parallel::trace_enter(dp, 42, parallel::CommKind::AllGather, 64, -1);
    parallel::activity_wait_begin(ticket);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    parallel::activity_wait_end();
    parallel::trace_leave(ticket);
    parallel::activity_checkpoint_wait_begin();  // ... then on its checkpoint's disk work
    parallel::activity_checkpoint_wait_begin();  // (nested: counted once)
    parallel::activity_checkpoint_wait_end();
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    parallel::activity_checkpoint_wait_end();
    parallel::activity_checkpoint_committed(20);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    monitor.finish(true);
  }
  unsetenv("PENTAD_MONITOR");
  supervisor.thread.join();
  const auto& lines = supervisor.lines;
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines.front()["type"], "hello");  // at once, before training starts
  EXPECT_EQ(lines.front()["rank"], 3);
  bool saw_started = false;
  for (const json& l : lines)
    if (l["type"] == "started") {
      saw_started = true;
      EXPECT_EQ(l["resume_step"], 7);
    }
  EXPECT_TRUE(saw_started);
  EXPECT_EQ(lines.back()["type"], "bye");
  EXPECT_EQ(lines.back()["status"], "done");
  bool saw_wait = false, saw_ckpt = false, saw_disk = false;
  int64_t last_step = 0, done = -2;
  for (const json& l : lines) {
    if (l["type"] != "beat") continue;
    last_step = l["step"];
    done = l["done"]["dp_test"];  // the highest collective completed: -1 until #42 ends
    if (l["phase"] == "wait") {
      EXPECT_EQ(done, -1);
    }
    saw_ckpt = saw_ckpt || l["ckpt_step"] == 20;
    saw_disk = saw_disk || l["phase"] == "checkpoint";
    if (l["phase"] != "wait") continue;
    saw_wait = true;
    EXPECT_EQ(l["wait"]["comm"], "dp_test");
    EXPECT_EQ(l["wait"]["kind"], "all_gather");
    EXPECT_EQ(l["wait"]["seq"], 42);
    EXPECT_EQ(l["wait"]["members"], (std::vector<int>{0, 3}));
    EXPECT_GE(l["wait"]["since_s"].get<double>(), 0.0);
    // Every step of the run is in some beat's recent list, each with its times.
    ASSERT_FALSE(l["recent"].empty());
    EXPECT_EQ(l["recent"].back()[0], 20);
  }
  EXPECT_TRUE(saw_wait) << "no beat while blocked in the collective";
  EXPECT_TRUE(saw_ckpt);
  EXPECT_TRUE(saw_disk) << "no beat while blocked on the checkpoint";
  EXPECT_EQ(last_step, 20);
  EXPECT_EQ(done, 42);
}

// A run shorter than one beat (a restart that resumes near the end): "started" and the
// last step still reach the supervisor before the bye, or it cannot tell that the run
// resumed (a CI failure of fault_detection: no "resumed" event).
TEST(Monitor, ARunShorterThanABeatReportsItsStartAndLastStep) {
  Listener supervisor;
  setenv("PENTAD_MONITOR", ("127.0.0.1:" + std::to_string(supervisor.port)).c_str(), 1);
  {
    launch::Monitor monitor(1, 2, "runs/test", /*beat_ms=*/300);
    ASSERT_TRUE(monitor.connected());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its first beat is out
    parallel::activity_run_started(3);
    for (int64_t step = 4; step <= 6; ++step) parallel::activity_step_done(step, 0.001);
    monitor.finish(true);
  }
  unsetenv("PENTAD_MONITOR");
  supervisor.thread.join();
  const auto& lines = supervisor.lines;
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines.back()["type"], "bye");
  // The activity state is the process's: run alone, "started" says 3; after the test
  // above, the monitor may have seen that run's start first (and says 7).
  size_t started = lines.size(), last_beat = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i]["type"] == "started" && started == lines.size()) started = i;
    if (lines[i]["type"] == "beat" && lines[i]["step"] == 6) last_beat = i;
  }
  EXPECT_LT(started, lines.size()) << "no \"started\" before the bye";
  EXPECT_LT(last_beat, lines.size()) << "the last step never reached the supervisor";
  EXPECT_LT(started, last_beat);
}

TEST(Monitor, AnUnreachableSupervisorCostsAWarningOnly) {
  setenv("PENTAD_MONITOR", "127.0.0.1:1", 1);  // nothing listens on port 1
  launch::Monitor monitor(0, 1, "runs/test");
  EXPECT_FALSE(monitor.connected());
  monitor.finish(true);
  unsetenv("PENTAD_MONITOR");
}
