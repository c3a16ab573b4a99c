#pragma once
// The supervisor's end of the monitor protocol: a TCP listener that accepts one connection
// per rank and cuts what arrives into newline-terminated messages. Rank -> supervisor only;
// nothing is ever written back, so a stopped or slow supervisor never blocks a rank for long
// (the rank's socket buffer absorbs its beats).
#include <functional>
#include <map>
#include <string>

namespace pentad::launch {

class MonitorServer {
 public:
  // Listens on all interfaces; port 0 takes any free one. Throws pentad::Error naming
  // --port when the port cannot be had.
  explicit MonitorServer(int port);
  MonitorServer(const MonitorServer&) = delete;
  MonitorServer& operator=(const MonitorServer&) = delete;
  ~MonitorServer();

  int port() const { return port_; }

  // Waits up to timeout_s for connections and data; hands each complete line to on_line and
  // each connection that ended to on_closed (after its last lines). Returns early on a
  // signal.
  void poll(double timeout_s, const std::function<void(int conn, const std::string&)>& on_line,
            const std::function<void(int conn)>& on_closed);

  void drop(int conn);  // closes one connection (no on_closed for it)
  void drop_all();

 private:
  int listen_fd_ = -1, port_ = 0;
  std::map<int, std::string> pending_;  // connection -> bytes after its last newline
};

// This machine's name as the ranks should dial it: the host name when it resolves, else
// 127.0.0.1 (the ranks must then run here).
std::string monitor_host();
// Whether a rank's reported host is this machine.
bool is_this_host(const std::string& host);

}  // namespace pentad::launch
