#include "checkpoint/direct_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace pentad::ckpt {

namespace {

constexpr size_t kPageBytes = 4096;  // a multiple of every logical block size O_DIRECT asks
constexpr size_t kMaxWriteBytes = size_t{64} << 20;  // per system call

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Writes all `bytes` at `offset`; 0 or the errno of the failure.
int write_all(int fd, const char* data, size_t bytes, int64_t offset) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, std::min(bytes, kMaxWriteBytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    data += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
  return 0;
}

}  // namespace

void write_extents(const std::string& path, const std::string& shown_path,
                   const std::vector<Extent>& extents, bool direct) {
  size_t total_bytes = 0;
  for (const Extent& e : extents) total_bytes += e.bytes;
  // One line, with what the write needed (a full disk: what to free).
  auto write_failed = [&](int err) {
    fail("{}: cannot write the data: {} ({} bytes of data)", shown_path, std::strerror(err),
         total_bytes);
  };
  Fd buffered(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (buffered.get() < 0)
    fail("{}: cannot open it to write the data: {}", shown_path, std::strerror(errno));
  // Fails (EINVAL) where the file system has no direct I/O: then everything is buffered.
  Fd unbuffered(direct ? ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT) : -1);
  for (const Extent& e : extents) {
    const char* data = static_cast<const char*>(e.data);
    size_t done = 0;
    if (unbuffered.get() >= 0 && e.offset % static_cast<int64_t>(kPageBytes) == 0 &&
        reinterpret_cast<uintptr_t>(data) % kPageBytes == 0) {
      const size_t pages = e.bytes / kPageBytes * kPageBytes;
      const int err = write_all(unbuffered.get(), data, pages, e.offset);
      if (err == 0)
        done = pages;
      else if (err == EINVAL)  // stricter alignment rules than a page: buffered from here on
        unbuffered.reset();
      else
        write_failed(err);
    }
    const int err = write_all(buffered.get(), data + done, e.bytes - done,
                              e.offset + static_cast<int64_t>(done));
    if (err != 0) write_failed(err);
  }
  if (::fsync(buffered.get()) != 0) write_failed(errno);  // delayed allocation fails here
}

}  // namespace pentad::ckpt
