#include "checkpoint/saver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>

#include "checkpoint/checksum.h"
#include "core/check.h"

namespace pentad::ckpt {

namespace {

// Each tensor's copy starts on a page, so that the writer can hand it to direct I/O.
constexpr size_t kPageBytes = 4096;
constexpr size_t kAlignFloats = kStagingAlignFloats;
static_assert(kAlignFloats * sizeof(float) == kPageBytes);
// Copy granularity: a piece is checksummed right after its copy, while it sits in L2,
// and the optimizer may follow the copy piece by piece.
constexpr size_t kPieceFloats = (size_t{256} << 10) / sizeof(float);
// From a device, pieces are larger: each costs a copy launch and an event to wait on, and
// the optimizer's chunks (AdamW::kChunkElements) are this size anyway. They are checksummed
// after the whole tensor is staged (copy_from_device).
constexpr size_t kDevicePieceFloats = (size_t{4} << 20) / sizeof(float);

// Threads that checksum a snapshot staged from a device: a quarter of the machine's cores
// (its ranks share them), 1 to 8.
int hash_threads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double thread_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

size_t numel_of(const LiveTensor& t) {
  return static_cast<size_t>(t.info.local_shape.numel());
}

// A file of `bytes` at path, every block allocated (a full tmpfs fails here, naming the
// file, rather than with SIGBUS at the first touch of a page it could not back), mapped
// shared: what is written there outlives the process.
float* map_shared(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create {} for host staging memory: {}", path, std::strerror(errno));
  int err = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (!err) err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* p = err ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && p == MAP_FAILED) err = errno;
  ::close(fd);
  if (err)
    fail("cannot allocate {} of host staging memory in {}: {}", format_bytes(bytes), path,
         std::strerror(err));
  return static_cast<float*>(p);
}

}  // namespace

void StagingFree::operator()(float* p) const {
  if (mapped)
    munmap(p, mapped);
  else
    std::free(p);
}

void AsyncSaver::set_shared_staging(std::string path) {
  PENTAD_CHECK(!busy_ && !staging_, "set_shared_staging() before any snapshot");
  shared_path_ = std::move(path);
}

std::vector<ShardInfo> AsyncSaver::staged_shards() const {
  std::vector<ShardInfo> shards;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    shards.push_back(tensors_[i].info);
    shards.back().checksum = i < checksums_.size() ? checksums_[i] : 0;
  }
  return shards;
}

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
  if (remover_.joinable()) remover_.join();
  if (staging_pinned_) host_unpin(staging_.get());
}

void AsyncSaver::begin(std::vector<std::string> files, std::vector<LiveTensor> tensors,
                       bool asynchronous, bool frozen, const Staged& fill) {
  wait_for_file();  // one snapshot at a time: the previous one must be on disk
  const auto start = std::chrono::steady_clock::now();
  files_ = std::move(files);
  tensors_ = std::move(tensors);
  staged_at_.clear();
  size_t floats = 0;
  for (const LiveTensor& t : tensors_) {
    staged_at_.push_back(floats);
    floats += (numel_of(t) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  copied_floats_.store(0);
  copy_ok_ = false;
  copied_ = false;
  file_done_ = false;
  error_.clear();
  file_errors_.assign(files_.size(), "");
  busy_ = true;
  background_ = asynchronous;
  frozen_ = frozen;
  has_snapshot_ = true;
  // The device copies queue behind the kernels issued so far, the optimizer step that
  // made this state among them.
  if (std::any_of(tensors_.begin(), tensors_.end(),
                  [](const LiveTensor& t) { return t.device != Device::CPU; }))
    copier_.begin_after_compute();
  if (std::any_of(tensors_.begin(), tensors_.end(),
                  [](const LiveTensor& t) { return t.from_caller; })) {
    PENTAD_CHECK(!frozen && fill, "state that is not in memory needs a copy snapshot and a fill");
    // Staged here, before the background thread starts: nothing races the caller's fill.
    ensure_staging(staging_floats(tensors_), false);
    fill(staged_places());
  }
  if (asynchronous) {
    thread_ = std::thread([this] { run(); });
  } else {
    run();
  }
  blocked_seconds_ += seconds_since(start);
}

size_t AsyncSaver::staging_floats(const std::vector<LiveTensor>& tensors) {
  size_t floats = 0;
  for (const LiveTensor& t : tensors)
    floats += (numel_of(t) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  return floats;
}

void AsyncSaver::reserve(const std::vector<LiveTensor>& tensors, bool touch) {
  PENTAD_CHECK(!busy_, "reserve() while a snapshot is in flight");
  const bool from_device = std::any_of(tensors.begin(), tensors.end(),
                                       [](const LiveTensor& t) { return t.device != Device::CPU; });
  ensure_staging(staging_floats(tensors), from_device);
  // Written once now, so that no snapshot pays for the first touch of its pages.
  if (touch && staging_capacity_ > 0)
    std::memset(staging_.get(), 0, staging_capacity_ * sizeof(float));
}

void AsyncSaver::ensure_staging(size_t floats, bool pinned) {
  // One uninitialised buffer, kept across snapshots: no zeroing pass before a copy.
  if (floats > staging_capacity_) {
    if (staging_pinned_) host_unpin(staging_.get());
    staging_pinned_ = false;
    staging_.reset();
    staging_capacity_ = 0;
    const size_t bytes = floats * sizeof(float);
    if (shared_path_.empty()) {
      staging_ = std::unique_ptr<float[], StagingFree>(
          static_cast<float*>(std::aligned_alloc(kPageBytes, bytes)), StagingFree{});
      if (!staging_) fail("cannot allocate {} of host staging memory", format_bytes(bytes));
    } else {
      staging_ = std::unique_ptr<float[], StagingFree>(map_shared(shared_path_, bytes),
                                                       StagingFree{bytes});
    }
    if (shared_path_.empty()) poison_host(staging_.get(), bytes);  // a file's bytes are its own
    staging_capacity_ = floats;
  }
  if (pinned && !staging_pinned_ && staging_capacity_ > 0) {  // kept across snapshots
    host_pin(staging_.get(), staging_capacity_ * sizeof(float));
    staging_pinned_ = true;
  }
}

std::vector<float*> AsyncSaver::staged_places() const {
  std::vector<float*> places(tensors_.size(), nullptr);
  if (staged())
    for (size_t i = 0; i < tensors_.size(); ++i) places[i] = staging_.get() + staged_at_[i];
  return places;
}

bool AsyncSaver::staged() const {
  return !frozen_ || std::any_of(tensors_.begin(), tensors_.end(),
                                 [](const LiveTensor& t) { return t.device != Device::CPU; });
}

void AsyncSaver::copy() {
  // Without reserve(), the first snapshot allocates (and first touches) the staging
  // buffer here, on the background thread. A frozen snapshot of host memory needs none:
  // it is checksummed and written where it lies.
  const bool from_device = std::any_of(tensors_.begin(), tensors_.end(),
                                       [](const LiveTensor& t) { return t.device != Device::CPU; });
  if (staged()) ensure_staging(staging_floats(tensors_), from_device);
  checksums_.assign(tensors_.size(), 0);
  Xxh3Stream hash;
  static_assert(kWrittenChecksum == ChecksumKind::Xxh3_64, "the copy computes xxh3-64");
  std::vector<size_t> from_devices;  // hashed once every tensor is staged and published
  for (size_t i = 0; i < tensors_.size(); ++i) {
    hash.reset();
    if (tensors_[i].device != Device::CPU) {
      copy_from_device(i);
      from_devices.push_back(i);
      continue;
    } else if (!staged()) {
      hash.update(tensors_[i].live, numel_of(tensors_[i]) * sizeof(float));
    } else {
      const size_t n = numel_of(tensors_[i]);
      float* staged = staging_.get() + staged_at_[i];
      for (size_t at = 0; at < n; at += kPieceFloats) {
        const size_t count = std::min(kPieceFloats, n - at);
        if (!tensors_[i].from_caller)  // begin()'s fill staged those already
          std::memcpy(staged + at, tensors_[i].live + at, count * sizeof(float));
        hash.update(staged + at, count * sizeof(float));
        publish(staged_at_[i] + at + count);
      }
    }
    checksums_[i] = hash.digest();
  }
  // Off a device, on threads of their own: one core's hash rate took longer than a GPT-2
  // 124M step on an H200 for its 1.4 GiB (2026-11-29), and the host's other cores are idle.
  std::vector<std::pair<const void*, size_t>> spans;
  for (size_t i : from_devices)
    spans.emplace_back(staging_.get() + staged_at_[i], numel_of(tensors_[i]) * sizeof(float));
  const std::vector<uint64_t> sums = xxh3_each(spans, hash_threads());
  for (size_t k = 0; k < from_devices.size(); ++k) checksums_[from_devices[k]] = sums[k];
}

void AsyncSaver::copy_from_device(size_t i) {
  // Every piece queued at once, each published as soon as the copier has passed it (then the
  // optimizer may overwrite its live memory): the copy runs at the bus's rate. Hashing it
  // piece by piece here held the copy to one core's hash rate (an H200, 2026-11-29: 1.4 GiB
  // took longer than the next step, which waited for it); copy() hashes it after.
  const LiveTensor& t = tensors_[i];
  const size_t n = numel_of(t);
  float* staged = staging_.get() + staged_at_[i];
  std::vector<size_t> marks;
  for (size_t at = 0; at < n; at += kDevicePieceFloats) {
    const size_t count = std::min(kDevicePieceFloats, n - at);
    copier_.copy(staged + at, Device::CPU, t.live + at, t.device, count * sizeof(float));
    marks.push_back(copier_.mark());
  }
  for (size_t k = 0, at = 0; at < n; ++k, at += kDevicePieceFloats) {
    copier_.wait(marks[k]);  // piece k is in staging
    publish(staged_at_[i] + std::min(n, at + kDevicePieceFloats));
  }
}

void AsyncSaver::publish(size_t staged_floats) {
  copied_floats_.store(staged_floats, std::memory_order_release);
  copied_floats_.notify_all();
}

void AsyncSaver::run() {
  // Tests stand in for a slow disk or a busy machine with PENTAD_SAVER_DELAY_MS: the
  // background thread starts that late, so that anything that writes the state before a
  // snapshot is on disk shows up in the file. Never set outside tests.
  static const int delay_ms = [] {
    const char* text = std::getenv("PENTAD_SAVER_DELAY_MS");
    return text ? std::atoi(text) : 0;
  }();
  if (background_ && delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  auto start = std::chrono::steady_clock::now();
  double cpu = thread_cpu_seconds();
  try {
    copy();
    if (on_copied_) on_copied_();
    copy_ok_ = true;
  } catch (const std::exception& e) {
    error_ = e.what();
  }
  // Done (or failed): nobody waits any longer.
  copied_floats_.store(std::numeric_limits<size_t>::max(), std::memory_order_release);
  copied_floats_.notify_all();
  copied_.store(true, std::memory_order_release);
  copied_.notify_all();
  timings_ = Timings{};
  timings_.copy_seconds = seconds_since(start);
  timings_.copy_cpu_seconds = thread_cpu_seconds() - cpu;

  // The copy was on the optimizer's critical path; the write is not: below the training
  // threads, the writer takes the cycles they leave.
  if (background_) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  start = std::chrono::steady_clock::now();
  cpu = thread_cpu_seconds();
  file_errors_.assign(files_.size(), error_);
  if (error_.empty() && !tensors_.empty()) {
    std::vector<ShardData> shards;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const float* data = staged() ? staging_.get() + staged_at_[i] : tensors_[i].live;
      ShardData shard{tensors_[i].info, data, true};
      shard.info.checksum = checksums_[i];
      shards.push_back(std::move(shard));
    }
    pooled_.wait(false);  // the files retired by the last commit (rank 0's) are reusable
    for (size_t f = 0; f < files_.size(); ++f) {
      try {
        if (write_rank_file(files_[f], shards, true, recycle_)) ++recycled_files_;
      } catch (const std::exception& e) {
        file_errors_[f] = e.what();
        if (error_.empty()) error_ = e.what();
      }
    }
  }
  timings_.write_seconds = seconds_since(start);
  timings_.write_cpu_seconds = thread_cpu_seconds() - cpu;
  file_done_.store(true);
}

void AsyncSaver::wait_for_copy(const float* begin, const float* end) {
  if (!copying() || begin >= end) return;
  // How far the copy must get: past the last live element of [begin, end) in staging order.
  const auto lo = reinterpret_cast<uintptr_t>(begin), hi = reinterpret_cast<uintptr_t>(end);
  size_t need = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].from_caller) continue;  // staged before begin() returned
    const auto first = reinterpret_cast<uintptr_t>(tensors_[i].live);
    const uintptr_t last = first + numel_of(tensors_[i]) * sizeof(float);
    if (last <= lo || first >= hi) continue;
    need = std::max(need, staged_at_[i] + (std::min(last, hi) - first) / sizeof(float));
  }
  size_t have = copied_floats_.load(std::memory_order_acquire);
  if (have >= need) return;
  const auto start = std::chrono::steady_clock::now();
  while (have < need) {
    copied_floats_.wait(have, std::memory_order_acquire);
    have = copied_floats_.load(std::memory_order_acquire);
  }
  blocked_seconds_ += seconds_since(start);
}

void AsyncSaver::wait_for_copy() {
  if (!busy_) return;
  const auto start = std::chrono::steady_clock::now();
  copied_.wait(false);
  blocked_seconds_ += seconds_since(start);
}

void AsyncSaver::wait_for_file() {
  if (!busy_) return;
  const auto start = std::chrono::steady_clock::now();
  if (thread_.joinable()) thread_.join();
  blocked_seconds_ += seconds_since(start);
  busy_ = false;
  if (!error_.empty()) fail("checkpoint write failed: {}", error_);
}

void AsyncSaver::remove_later(std::vector<std::string> dirs) {
  wait_for_removal();
  if (dirs.empty()) return;
  if (recycle_) pooled_.store(false);
  remover_ = std::thread([this, dirs = std::move(dirs)] {
    if (recycle_) {  // renames, at once: the next file of this rank waits for them
      pool_rank_files(dirs);
      pooled_.store(true);
      pooled_.notify_all();
    }
    // Mostly waiting on the disk; below the training threads for what CPU it takes.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
    remove_dirs(dirs);
  });
}

void AsyncSaver::wait_for_removal() {
  if (!remover_.joinable()) return;
  const auto start = std::chrono::steady_clock::now();
  remover_.join();
  blocked_seconds_ += seconds_since(start);
}

bool AsyncSaver::restore(const Staged& put) {
  if (!has_snapshot_) return false;
  PENTAD_CHECK(staged(), "a frozen snapshot of host memory is restored by its owner, not copied");
  wait_for_copy();
  // A failed copy (no staging memory, a device error) leaves no snapshot; a failed write
  // leaves it whole.
  if (!copy_ok_) return false;
  bool from_caller = false;
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].from_caller)
      from_caller = true;
    else
      copy_bytes(tensors_[i].live, tensors_[i].device, staging_.get() + staged_at_[i], Device::CPU,
                 numel_of(tensors_[i]) * sizeof(float));
  if (from_caller) {
    PENTAD_CHECK(put, "restore(): state that is not in memory needs a put");
    put(staged_places());
  }
  return true;
}

}  // namespace pentad::ckpt
