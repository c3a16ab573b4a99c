#include "optim/nvme_state.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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

// Mapped, not taken from the heap: a background read's staging buffer goes back to the
// system when it is freed (malloc would keep it resident for the next), and fresh pages are
// zeros, so the padding past each piece's elements stays zero.
struct NvmeState::Buffer {
  char* data = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t size) : bytes(round_up(size)) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      fail("cannot map {} bytes ({:.1f} MiB) of host buffers for the NVMe offload: {}", bytes,
           mib(bytes), std::strerror(errno));
    data = static_cast<char*>(p);
  }
  ~Buffer() { ::munmap(data, bytes); }
};

struct NvmeState::Background {
  struct Copy {
    int64_t out = 0;     // element offset in finish_read()'s out
    size_t staging = 0;  // byte offset in the staging buffer
    int64_t count = 0;
  };
  std::unique_ptr<Buffer> staging;
  std::vector<Copy> copies;  // one per sub-group touched
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
  stream(fn, true);
}

void NvmeState::scan(const UpdateFn& fn) {
  stream(fn, false);
}

void NvmeState::stream(const UpdateFn& fn, bool write_back) {
  PENTAD_CHECK(background_.empty(), "streaming the file with {} background reads in flight",
               background_.size());
  const int64_t n = groups();
  uint64_t read_ticket[kSlots] = {}, write_ticket[kSlots] = {};  // 0: none outstanding
  auto wait = [&](uint64_t& ticket, double& seconds) {
    const auto start = std::chrono::steady_clock::now();
    queue_->wait(ticket);
    ticket = 0;
    seconds += seconds_since(start);
  };
  std::vector<float*> state(tensors_);
  double scan_wait_s = 0;  // a checkpoint's scan: its caller times it, not the optimizer's
  double& read_wait_s = write_back ? stats_.read_wait_s : scan_wait_s;
  try {
    read_ticket[0] = post(IoDir::read, 0, 0, 0, tensors_);
    for (int64_t k = 0; k < n; ++k) {
      const int slot = static_cast<int>(k % kSlots);
      if (k + 1 < n) {  // its slot last held k - 2, whose write had fn(k - 1) to finish
        const int next = static_cast<int>((k + 1) % kSlots);
        if (write_ticket[next] != 0) wait(write_ticket[next], stats_.write_wait_s);
        read_ticket[next] = post(IoDir::read, k + 1, next, 0, tensors_);
      }
      wait(read_ticket[slot], read_wait_s);
      for (int t = 0; t < tensors_; ++t) state[t] = reinterpret_cast<float*>(slot_piece(slot, t));
      fn(k * group_size_, k * group_size_ + group_elements(k), state.data());
      if (write_back) write_ticket[slot] = post(IoDir::write, k, slot, 0, tensors_);
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
  PENTAD_CHECK(background_.empty(), "write() with {} background reads of the file in flight",
               background_.size());
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

uint64_t NvmeState::start_read(int tensor, int64_t begin, int64_t end) {
  check_range(tensor, begin, end);
  PENTAD_CHECK(begin < end, "an empty background read");
  // Per sub-group the pages of tensor's piece that hold [lo, hi): offsets in the file and
  // lengths stay multiples of a page, the staging buffer takes them back to back.
  struct Part {
    int64_t file = 0;
    size_t bytes = 0;
  };
  auto background = std::make_unique<Background>();
  std::vector<Part> parts;
  size_t staging_bytes = 0;
  for (int64_t g = begin / group_size_; g * group_size_ < end; ++g) {
    const int64_t lo = std::max(begin, g * group_size_) - g * group_size_;
    const int64_t hi = std::min(end, g * group_size_ + group_elements(g)) - g * group_size_;
    const size_t first = static_cast<size_t>(lo) * sizeof(float) / kPageBytes * kPageBytes;
    const size_t last = round_up(static_cast<size_t>(hi) * sizeof(float));
    parts.push_back({piece_offset(g, tensor) + static_cast<int64_t>(first), last - first});
    background->copies.push_back({g * group_size_ + lo - begin,
                                  staging_bytes + static_cast<size_t>(lo) * sizeof(float) - first,
                                  hi - lo});
    staging_bytes += last - first;
  }
  background->staging = std::make_unique<Buffer>(staging_bytes);
  std::vector<IoSpan> spans;
  size_t at = 0;
  for (const Part& part : parts) {
    spans.push_back({part.file, background->staging->data + at, part.bytes});
    at += part.bytes;
  }
  stats_.bytes_read += static_cast<double>(staging_bytes);
  stats_.background_bytes += static_cast<double>(staging_bytes);
  const uint64_t ticket = queue_->post(IoDir::read, std::move(spans));
  background_.emplace(ticket, std::move(background));
  return ticket;
}

int64_t NvmeState::read_elements(uint64_t read) const {
  auto it = background_.find(read);
  PENTAD_CHECK(it != background_.end(), "background read {} is not in flight", read);
  int64_t elements = 0;
  for (const Background::Copy& c : it->second->copies) elements += c.count;
  return elements;
}

void NvmeState::finish_read(uint64_t read, float* out) {
  auto it = background_.find(read);
  PENTAD_CHECK(it != background_.end(), "background read {} is not in flight", read);
  const std::unique_ptr<Background> background = std::move(it->second);
  background_.erase(it);
  const auto start = std::chrono::steady_clock::now();
  queue_->wait(read);  // throws after every request of it is done: the staging may go
  stats_.background_wait_s += seconds_since(start);
  for (const Background::Copy& c : background->copies)
    std::memcpy(out + c.out, background->staging->data + c.staging,
                static_cast<size_t>(c.count) * sizeof(float));
}

}  // namespace pentad
