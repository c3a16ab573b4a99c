#include "optim/nvme_state.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/check.h"
#include "optim/uring_queue.h"

namespace pentad {

namespace {

constexpr size_t kPageBytes = 4096;  // O_DIRECT's alignment of offsets, lengths and memory
constexpr int kSlots = 3;            // sub-groups in host memory: being read, updated, written

size_t round_up(size_t bytes) {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

double mib(double bytes) {
  return bytes / 1048576.0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

size_t free_bytes(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return 0;
  return static_cast<size_t>(fs.f_bavail) * fs.f_frsize;  // what an unprivileged writer gets
}

[[noreturn]] void no_space(const std::string& path, const std::string& dir, size_t needs) {
  const size_t free = free_bytes(dir);
  fail("{}: No space left on device: needs {} bytes ({:.1f} MiB), {} bytes ({:.1f} MiB) free", path,
       needs, mib(needs), free, mib(free));
}

void check_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT)
      fail("{}: the offload directory (parallel.offload_path) does not exist", dir);
    fail("{}: cannot use it as the offload directory (parallel.offload_path): {}", dir,
         std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    fail("{}: the offload directory (parallel.offload_path) is not a directory", dir);
}

}  // namespace

struct NvmeState::Buffer {
  char* data = nullptr;
  explicit Buffer(size_t bytes) {
    data = static_cast<char*>(std::aligned_alloc(kPageBytes, bytes));
    if (data == nullptr)
      fail("cannot allocate {} bytes ({:.1f} MiB) of host buffers for the NVMe offload", bytes,
           mib(bytes));
    std::memset(data, 0, bytes);  // the padding past each piece's elements stays zero
  }
  ~Buffer() { std::free(data); }
};

NvmeState::NvmeState(const NvmeOptions& options, const std::string& file_name, int64_t elements,
                     int tensors)
    : options_(options), elements_(elements), tensors_(tensors) {
  if (options.block_bytes == 0 || options.block_bytes % kPageBytes != 0)
    fail("NVMe offload: block_bytes must be a positive multiple of {}, not {}", kPageBytes,
         options.block_bytes);
  if (options.queue_depth < 1)
    fail("NVMe offload: queue_depth must be at least 1, not {}", options.queue_depth);
  if (options.subgroup_elements < 1)
    fail("NVMe offload: subgroup_elements must be at least 1, not {}", options.subgroup_elements);
  PENTAD_CHECK(elements >= 1 && tensors >= 1, "{} tensors of {} elements", tensors, elements);
  group_size_ = std::min(options.subgroup_elements, elements);
  piece_bytes_ = round_up(static_cast<size_t>(group_size_) * sizeof(float));
  const int64_t last = groups() - 1;
  file_bytes_ = static_cast<size_t>(piece_offset(last, 0)) + tensors * piece_bytes(last);

  check_dir(options.dir);
  path_ = (std::filesystem::path(options.dir) / file_name).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  if (fd_ < 0 && errno == EINVAL) {  // the file system has no direct I/O (an old tmpfs)
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ >= 0)
      spdlog::warn(
          "{}: the file system refuses O_DIRECT; the offloaded optimizer state goes "
          "through the page cache (buffered I/O, slower, and it takes host memory)",
          path_);
  }
  if (fd_ < 0) fail("{}: cannot create the offload file: {}", path_, std::strerror(errno));
  try {
    // Space first, so that a full disk is reported before anything is written.
    if (free_bytes(options.dir) < file_bytes_) no_space(path_, options.dir, file_bytes_);
    // Preallocated, so no later write can run out of space halfway through a step.
    const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(file_bytes_));
    if (err == ENOSPC) no_space(path_, options.dir, file_bytes_);
    if (err == EOPNOTSUPP || err == EINVAL) {  // no fallocate: a sparse file reads as zeros too
      if (::ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0)
        fail("{}: cannot size the offload file to {} bytes: {}", path_, file_bytes_,
             std::strerror(errno));
    } else if (err != 0) {
      fail("{}: cannot preallocate {} bytes: {}", path_, file_bytes_, std::strerror(err));
    }
    buffer_ = std::make_unique<Buffer>(host_buffer_bytes());
    queue_ = std::make_unique<UringQueue>(fd_, path_, file_bytes_, options.block_bytes,
                                          options.queue_depth);
  } catch (...) {
    ::close(fd_);
    ::unlink(path_.c_str());
    throw;
  }
}

NvmeState::~NvmeState() {
  queue_.reset();  // waits for the I/O still in flight
  ::close(fd_);
  ::unlink(path_.c_str());
}

int64_t NvmeState::groups() const {
  return (elements_ + group_size_ - 1) / group_size_;
}

int64_t NvmeState::group_elements(int64_t g) const {
  return std::min(group_size_, elements_ - g * group_size_);
}

int64_t NvmeState::piece_offset(int64_t g, int tensor) const {
  return g * tensors_ * static_cast<int64_t>(piece_bytes_) +
         tensor * static_cast<int64_t>(piece_bytes(g));
}

size_t NvmeState::piece_bytes(int64_t g) const {
  return round_up(static_cast<size_t>(group_elements(g)) * sizeof(float));
}

char* NvmeState::slot_piece(int slot, int tensor) const {
  return buffer_->data + (static_cast<size_t>(slot) * tensors_ + tensor) * piece_bytes_;
}

uint64_t NvmeState::post(IoDir dir, int64_t g, int slot, int first_tensor, int tensors) {
  std::vector<IoSpan> spans;
  for (int i = 0; i < tensors; ++i)
    spans.push_back({piece_offset(g, first_tensor + i), slot_piece(slot, i), piece_bytes(g)});
  const double bytes = static_cast<double>(tensors * piece_bytes(g));
  (dir == IoDir::read ? stats_.bytes_read : stats_.bytes_written) += bytes;
  return queue_->post(dir, std::move(spans));
}

void NvmeState::update(const UpdateFn& fn) {
  const int64_t n = groups();
  uint64_t read_ticket[kSlots] = {}, write_ticket[kSlots] = {};  // 0: none outstanding
  auto wait = [&](uint64_t& ticket, double& seconds) {
    const auto start = std::chrono::steady_clock::now();
    queue_->wait(ticket);
    ticket = 0;
    seconds += seconds_since(start);
  };
  std::vector<float*> state(tensors_);
  try {
    read_ticket[0] = post(IoDir::read, 0, 0, 0, tensors_);
    for (int64_t k = 0; k < n; ++k) {
      const int slot = static_cast<int>(k % kSlots);
      if (k + 1 < n) {  // its slot last held k - 2, whose write had fn(k - 1) to finish
        const int next = static_cast<int>((k + 1) % kSlots);
        if (write_ticket[next] != 0) wait(write_ticket[next], stats_.write_wait_s);
        read_ticket[next] = post(IoDir::read, k + 1, next, 0, tensors_);
      }
      wait(read_ticket[slot], stats_.read_wait_s);
      for (int t = 0; t < tensors_; ++t) state[t] = reinterpret_cast<float*>(slot_piece(slot, t));
      fn(k * group_size_, k * group_size_ + group_elements(k), state.data());
      write_ticket[slot] = post(IoDir::write, k, slot, 0, tensors_);
    }
    for (int64_t k = std::max<int64_t>(0, n - kSlots); k < n; ++k) {  // in the order posted
      uint64_t& ticket = write_ticket[k % kSlots];
      if (ticket != 0) wait(ticket, stats_.write_wait_s);
    }
  } catch (...) {
    queue_->drain();  // nothing may still be moving into or out of the slots
    throw;
  }
}

void NvmeState::check_range(int tensor, int64_t begin, int64_t end) const {
  PENTAD_CHECK(tensor >= 0 && tensor < tensors_, "tensor {} of {}", tensor, tensors_);
  PENTAD_CHECK(begin >= 0 && begin <= end && end <= elements_, "[{}, {}) of {} elements", begin,
               end, elements_);
}

// Both stream tensor's pieces through the three slots (for one tensor each slot's first
// piece), so the copy of one sub-group overlaps the transfer of the next.
void NvmeState::read(int tensor, int64_t begin, int64_t end, float* out) {
  check_range(tensor, begin, end);
  if (begin == end) return;
  const int64_t g0 = begin / group_size_, g1 = (end - 1) / group_size_ + 1;
  uint64_t ticket[kSlots] = {};
  try {
    for (int64_t g = g0; g < std::min(g0 + kSlots, g1); ++g)
      ticket[(g - g0) % kSlots] =
          post(IoDir::read, g, static_cast<int>((g - g0) % kSlots), tensor, 1);
    for (int64_t g = g0; g < g1; ++g) {
      const int slot = static_cast<int>((g - g0) % kSlots);
      queue_->wait(ticket[slot]);
      ticket[slot] = 0;
      const int64_t lo = std::max(begin, g * group_size_);
      const int64_t hi = std::min(end, g * group_size_ + group_elements(g));
      const auto* piece = reinterpret_cast<const float*>(slot_piece(slot, 0));
      std::memcpy(out + (lo - begin), piece + (lo - g * group_size_),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      if (g + kSlots < g1) ticket[slot] = post(IoDir::read, g + kSlots, slot, tensor, 1);
    }
  } catch (...) {
    queue_->drain();
    throw;
  }
}

void NvmeState::write(int tensor, int64_t begin, int64_t end, const float* in) {
  check_range(tensor, begin, end);
  if (begin == end) return;
  const int64_t g0 = begin / group_size_, g1 = (end - 1) / group_size_ + 1;
  uint64_t ticket[kSlots] = {};
  try {
    for (int64_t g = g0; g < g1; ++g) {
      const int slot = static_cast<int>((g - g0) % kSlots);
      if (ticket[slot] != 0) queue_->wait(ticket[slot]);  // g - 3's write, out of the slot
      ticket[slot] = 0;
      const int64_t lo = std::max(begin, g * group_size_);
      const int64_t hi = std::min(end, g * group_size_ + group_elements(g));
      if (hi - lo < group_elements(g))  // part of a piece: the rest keeps what the file holds
        queue_->wait(post(IoDir::read, g, slot, tensor, 1));
      auto* piece = reinterpret_cast<float*>(slot_piece(slot, 0));
      std::memcpy(piece + (lo - g * group_size_), in + (lo - begin),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      ticket[slot] = post(IoDir::write, g, slot, tensor, 1);
    }
    for (int64_t g = std::max(g0, g1 - kSlots); g < g1; ++g) {
      uint64_t& t = ticket[(g - g0) % kSlots];
      if (t != 0) queue_->wait(t);
      t = 0;
    }
  } catch (...) {
    queue_->drain();
    throw;
  }
}

}  // namespace pentad
