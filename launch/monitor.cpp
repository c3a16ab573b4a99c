#include "launch/monitor.h"

#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "parallel/activity.h"

namespace pentad::launch {
namespace {

// A TCP connection to host:port, or -1 (with the reason in `why`).
int connect_to(const std::string& address, std::string& why) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    why = "not host:port";
    return -1;
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

// SIGTERM (mpirun ending the other ranks after one died, or the supervisor ending the job):
// a goodbye first, so that the supervisor tells the rank that died from those ended after it.
// send() is async-signal-safe; the message is made before the handler is installed.
int g_fd = -1;
char g_bye[96];
size_t g_bye_size = 0;

void say_bye_and_terminate(int signo) {
  if (g_fd >= 0) {
    [[maybe_unused]] ssize_t n = send(g_fd, g_bye, g_bye_size, MSG_NOSIGNAL);
  }
  std::signal(signo, SIG_DFL);
  std::raise(signo);
}

std::string attempt() {
  const char* a = std::getenv("PENTAD_LAUNCH_ATTEMPT");
  return a ? a : "0";
}

}  // namespace

Monitor::Monitor(int world_rank, int world_size, std::string out_dir, int beat_ms,
                 MonitorLayout layout, std::vector<std::string> ckpt_dirs)
    : rank_(world_rank),
      world_(world_size),
      out_dir_(std::move(out_dir)),
      beat_ms_(beat_ms),
      layout_(layout),
      ckpt_dirs_(std::move(ckpt_dirs)) {
  const char* address = std::getenv("PENTAD_MONITOR");
  if (!address || !*address) return;
  std::string why;
  fd_ = connect_to(address, why);
  if (fd_ < 0) {
    spdlog::warn("PENTAD_MONITOR = {}: cannot reach the supervisor ({}); training without it",
                 address, why);
    return;
  }
  const std::string bye = fmt::format(
      "{{\"type\":\"bye\",\"rank\":{},\"status\":\"terminated\",\"message\":\"SIGTERM\"}}\n",
      rank_);
  std::memcpy(g_bye, bye.data(), std::min(bye.size(), sizeof(g_bye)));
  g_bye_size = std::min(bye.size(), sizeof(g_bye));
  g_fd = fd_;
  std::signal(SIGTERM, say_bye_and_terminate);
  thread_ = std::thread([this] { run(); });
}

Monitor::~Monitor() {
  if (fd_ >= 0 && !said_bye_) finish(false, "the rank ended without finishing");
  if (fd_ >= 0) {
    std::signal(SIGTERM, SIG_DFL);
    g_fd = -1;
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

void Monitor::finish(bool ok, const std::string& message, bool refused, const ByeCause& cause) {
  if (fd_ < 0 || said_bye_.exchange(true)) return;
  stop_ = true;
  if (thread_.joinable()) thread_.join();  // the last beat goes before the bye
  nlohmann::json bye{{"type", "bye"},
                     {"rank", rank_},
                     {"status", ok        ? "done"
                                : refused ? "refused"
                                          : "error"},
                     {"message", message}};
  if (!cause.kind.empty()) bye["cause"] = {{"kind", cause.kind}, {"path", cause.path}};
  send_line(bye.dump());
}

bool Monitor::send_line(const std::string& line) {
  const std::string data = line + "\n";
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += size_t(n);
  }
  return true;
}

void Monitor::run() {
  const auto start = std::chrono::steady_clock::now();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // Hello at once (a rank may die before training starts); the step it starts from once
  // known ("started", after any resume); beats throughout (phase "other" before the start).
  nlohmann::json hello{{"type", "hello"},
                       {"rank", rank_},
                       {"world", world_},
                       {"pid", int(getpid())},
                       {"host", host},
                       {"out_dir", out_dir_},
                       {"attempt", std::stoi(attempt())},
                       {"resume_step", -1},
                       {"layout",
                        {{"dp", layout_.dp},
                         {"tp", layout_.tp},
                         {"cp", layout_.cp},
                         {"pp", layout_.pp},
                         {"ep", layout_.ep},
                         {"etp", layout_.etp},
                         {"micro_batch", layout_.micro_batch},
                         {"grad_accum", layout_.grad_accum}}}};
  // Absolute: the supervisor checks them from its own working directory.
  nlohmann::json dirs = nlohmann::json::array();
  for (const std::string& dir : ckpt_dirs_) {
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
    dirs.push_back(ec ? dir : absolute.lexically_normal().string());
  }
  hello["ckpt_dirs"] = std::move(dirs);
  if (!send_line(hello.dump())) return;
  bool started = false;
  // Once stopping, one more round: the last step (and "started", for a run shorter than a
  // beat) reaches the supervisor before the bye, which tells a resumed run from none.
  for (bool last = false; !last;) {
    last = stop_;
    const parallel::ProgressSnapshot p = parallel::activity_progress();
    if (p.started && !started) {
      started = true;
      nlohmann::json note{{"type", "started"}, {"rank", rank_}, {"resume_step", p.start_step}};
      if (!send_line(note.dump())) break;
    }
    // Read before the wait: a wait this beat shows has not completed in `done`, so no beat
    // contradicts itself (the wait may end between the two reads, never the other way).
    const std::map<std::string, int64_t> done = parallel::trace_collectives_done();
    const parallel::WaitSnapshot w = parallel::activity_wait();
    nlohmann::json beat{
        {"type", "beat"},
        {"rank", rank_},
        {"t", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
        {"step", p.step},
        {"phase", w.waiting               ? "wait"
                  : w.checkpoint_s >= 0.0 ? "checkpoint"
                  : started               ? "compute"
                                          : "other"},
        {"step_seconds", p.step_seconds},
        {"wait_seconds", p.wait_seconds},
        {"ckpt_step", p.ckpt_step}};
    nlohmann::json recent = nlohmann::json::array();
    for (const parallel::ProgressSnapshot::Step& s : p.recent)
      recent.push_back({s.step, s.seconds, s.wait_seconds, s.compute_cpu});
    beat["recent"] = std::move(recent);
    // This rank's row of the link matrix, [[peer, send s/MB, receive s/MB], ...] (-1: none).
    nlohmann::json links = nlohmann::json::array();
    for (const parallel::LinkCost& l : parallel::activity_links())
      links.push_back({l.peer, l.send_s_per_mb, l.recv_s_per_mb});
    if (!links.empty()) beat["p2p"] = std::move(links);
    // The highest collective completed on each communicator (the detector's staleness check).
    beat["done"] = done;
    if (w.waiting)
      beat["wait"] = {{"comm", w.comm},
                      {"kind", w.kind},
                      {"seq", w.seq},
                      {"since_s", w.since_s},
                      {"members", w.members}};
    if (!send_line(beat.dump())) break;  // the supervisor is gone: training goes on
    if (!last) std::this_thread::sleep_for(std::chrono::milliseconds(beat_ms_));
  }
}

}  // namespace pentad::launch
