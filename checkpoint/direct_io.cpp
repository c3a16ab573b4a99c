#include "checkpoint/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
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

void overlay_layout(const std::string& layout, const std::string& target,
                    const std::string& shown_path, std::vector<Extent> extents) {
  auto failed = [&](const char* what, int err) {
    fail("{}: cannot reuse an earlier checkpoint's file ({}): {}", shown_path, what,
         std::strerror(err));
  };
  Fd from(::open(layout.c_str(), O_RDONLY | O_CLOEXEC));
  if (from.get() < 0) failed("open", errno);
  Fd to(::open(target.c_str(), O_WRONLY | O_CLOEXEC));
  if (to.get() < 0) failed("open", errno);
  struct stat st {};
  if (::fstat(from.get(), &st) != 0) failed("stat", errno);
  const auto size = static_cast<int64_t>(st.st_size);
  if (::ftruncate(to.get(), size) != 0) failed("truncate", errno);
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  std::vector<char> gap;
  int64_t at = 0;  // everything before `at` outside the extents is copied
  auto copy_until = [&](int64_t end) {
    end = std::min(end, size);
    if (end <= at) return;
    gap.resize(static_cast<size_t>(end - at));
    size_t got = 0;
    while (got < gap.size()) {
      const ssize_t n =
          ::pread(from.get(), gap.data() + got, gap.size() - got, at + static_cast<int64_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) failed("read", n < 0 ? errno : EIO);
      got += static_cast<size_t>(n);
    }
    if (const int err = write_all(to.get(), gap.data(), gap.size(), at)) failed("write", err);
    at = end;
  };
  for (const Extent& e : extents) {
    copy_until(e.offset);
    at = std::max(at, e.offset + static_cast<int64_t>(e.bytes));
  }
  copy_until(size);
}

}  // namespace pentad::ckpt
