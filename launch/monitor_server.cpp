#include "launch/monitor_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace pentad::launch {

namespace {

constexpr size_t kMaxLineBytes = 1 << 20;  // a beat is ~300 bytes; more is a broken peer

}  // namespace

MonitorServer::MonitorServer(int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) fail("pentad launch: socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 1024) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    fail(
        "pentad launch: cannot listen on port {}: {} (choose another with --port, or --port 0 "
        "for any free one)",
        port, std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

MonitorServer::~MonitorServer() {
  drop_all();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MonitorServer::poll(double timeout_s,
                         const std::function<void(int, const std::string&)>& on_line,
                         const std::function<void(int)>& on_closed) {
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  for (const auto& [fd, bytes] : pending_) fds.push_back({fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), int(timeout_s * 1000)) <= 0) return;  // timeout, EINTR

  if (fds[0].revents & POLLIN) {
    int fd;
    while ((fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0)
      pending_[fd] = {};
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    const int fd = fds[i].fd;
    if (!fds[i].revents || !pending_.count(fd)) continue;  // dropped while handling another
    std::string& buffer = pending_[fd];
    bool ended = false;
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n > 0) {
        buffer.append(chunk, size_t(n));
        continue;
      }
      ended = n == 0 || (errno != EAGAIN && errno != EINTR);
      break;
    }
    std::vector<std::string> lines;
    size_t start = 0, newline;
    while ((newline = buffer.find('\n', start)) != std::string::npos) {
      lines.push_back(buffer.substr(start, newline - start));
      start = newline + 1;
    }
    buffer.erase(0, start);
    if (buffer.size() > kMaxLineBytes) ended = true;
    // on_line may drop this connection: stop handing it lines then, and report no close.
    for (const std::string& line : lines)
      if (pending_.count(fd)) on_line(fd, line);
    if (ended && pending_.count(fd)) {
      ::close(fd);
      pending_.erase(fd);
      on_closed(fd);
    }
  }
}

void MonitorServer::drop(int conn) {
  if (pending_.erase(conn)) ::close(conn);
}

void MonitorServer::drop_all() {
  for (const auto& [fd, bytes] : pending_) ::close(fd);
  pending_.clear();
}

std::string monitor_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) return "127.0.0.1";
  ::freeaddrinfo(found);
  return name;
}

bool is_this_host(const std::string& host) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const std::string mine = name;
  auto short_name = [](const std::string& h) { return h.substr(0, h.find('.')); };
  return host == mine || short_name(host) == short_name(mine) || host == "localhost" ||
         host == "127.0.0.1";
}

}  // namespace pentad::launch
