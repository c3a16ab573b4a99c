#include "launch/host_check.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace pentad::launch {

bool host_answers(const std::string& host, double timeout_s, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    return false;
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          found->ai_protocol);
  bool answered = false;
  if (fd >= 0) {
    int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
    if (rc == 0 || errno == ECONNREFUSED) {
      answered = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, int(timeout_s * 1000)) == 1) {
        int error = 0;
        socklen_t size = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
        answered = error == 0 || error == ECONNREFUSED;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return answered;
}

}  // namespace pentad::launch
