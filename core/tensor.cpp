#include "core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>

#include "core/device_memory.h"

namespace pentad {

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::U16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::U16:
      return "u16";
  }
  return "?";
}

const char* device_name(Device device) {
  return device == Device::CPU ? "cpu" : "cuda";
}

Shape::Shape(std::initializer_list<int64_t> list) {
  PENTAD_CHECK(list.size() <= kMaxDims, "at most {} dims", kMaxDims);
  for (int64_t d : list) dims[static_cast<size_t>(ndim++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (ndim != other.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[static_cast<size_t>(i)] != other.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i)
    s += (i ? ", " : "") + std::to_string(dims[static_cast<size_t>(i)]);
  return s + ")";
}

namespace {
struct HostArenas {
  std::mutex mutex;
  HostArenaUse use;
};
HostArenas& host_arenas() {
  static HostArenas h;
  return h;
}
void count_host_arena(size_t bytes, bool added) {
  HostArenas& h = host_arenas();
  std::lock_guard lock(h.mutex);
  if (added) {
    h.use.bytes += bytes;
    h.use.peak_bytes = std::max(h.use.peak_bytes, h.use.bytes);
  } else {
    h.use.bytes -= std::min(bytes, h.use.bytes);
  }
}
}  // namespace

HostArenaUse host_arena_use() {
  HostArenas& h = host_arenas();
  std::lock_guard lock(h.mutex);
  return h.use;
}

void reset_host_arena_peak() {
  HostArenas& h = host_arenas();
  std::lock_guard lock(h.mutex);
  h.use.peak_bytes = h.use.bytes;
}

Arena::Arena() = default;

Arena::Arena(std::string name, size_t bytes, Device device)
    : name_(std::move(name)), capacity_(aligned(bytes)), device_(device) {
  if (capacity_ == 0) return;
  if (device == Device::CUDA) {
    base_ = device_alloc(capacity_, "the " + name_ + " arena");  // cudaMalloc: 256-byte aligned
    if (poison_enabled()) device_fill_ones(base_, capacity_);
    return;
  }
  // Large arenas start on a page (direct I/O can write their page-aligned tensors).
  const size_t align = capacity_ >= kPageThreshold ? kPageBytes : kAlignment;
  capacity_ = (capacity_ + align - 1) / align * align;
  base_ = std::aligned_alloc(align, capacity_);
  if (!base_) fail("cannot allocate {} for the {} arena", format_bytes(capacity_), name_);
  count_host_arena(capacity_, true);
  poison_host(base_, capacity_);
}

void Arena::reset() {
  used_ = 0;
  if (!base_ || !poison_enabled()) return;
  if (device_ == Device::CUDA)
    device_fill_ones(base_, capacity_);
  else
    poison_host(base_, capacity_);
}

Arena Arena::measuring(std::string name) {
  Arena arena;
  arena.name_ = std::move(name);
  arena.capacity_ = SIZE_MAX;
  arena.measuring_ = true;
  return arena;
}

Arena Arena::reserved(std::string name, size_t bytes, Device device) {
  Arena arena;
  arena.name_ = std::move(name);
  arena.device_ = device;
  if (device == Device::CUDA) {
    arena.reservation_ =
        std::make_unique<DeviceReservation>(bytes, "the " + arena.name_ + " arena");
    arena.granule_ = arena.reservation_->granule();
    arena.capacity_ = arena.reservation_->bytes();
    arena.base_ = arena.reservation_->base();
    return arena;
  }
  arena.granule_ = kPageBytes;
  arena.capacity_ =
      std::max<size_t>(kPageBytes, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes);
  void* base =
      mmap(nullptr, arena.capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    fail("cannot reserve {} of addresses for the {} arena", format_bytes(arena.capacity_),
         arena.name_);
  arena.base_ = base;
  return arena;
}

void Arena::commit(size_t begin, size_t end) {
  PENTAD_CHECK(is_reserved() && begin <= end && end <= capacity_,
               "{} arena: commit [{}, {}) of {} bytes{}", name_, begin, end, capacity_,
               is_reserved() ? "" : " (not a reserved arena)");
  if (begin == end) return;
  begin = begin / granule_ * granule_;
  end = std::min(capacity_, (end + granule_ - 1) / granule_ * granule_);
  // The parts of [begin, end) not yet backed, then the merged list.
  std::vector<std::pair<size_t, size_t>> missing, merged;
  size_t at = begin;
  for (const auto& [b, e] : committed_) {
    if (e <= at || b >= end) continue;
    if (b > at) missing.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < end) missing.emplace_back(at, end);
  for (const auto& [b, e] : missing) {
    if (device_ == Device::CUDA) {
      reservation_->map(b, e - b);
      device_zero(static_cast<char*>(base_) + b, e - b);
    } else if (mprotect(static_cast<char*>(base_) + b, e - b, PROT_READ | PROT_WRITE) != 0) {
      fail("cannot back {} of the {} arena", format_bytes(e - b), name_);
    } else {
      count_host_arena(e - b, true);
    }
    committed_.emplace_back(b, e);
  }
  std::sort(committed_.begin(), committed_.end());
  for (const auto& range : committed_)
    if (!merged.empty() && merged.back().second >= range.first)
      merged.back().second = std::max(merged.back().second, range.second);
    else
      merged.push_back(range);
  committed_ = std::move(merged);
}

void Arena::prefer_huge_pages() {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (device_ != Device::CPU || !base_ || capacity_ < kHugePage) return;
  // Advice only: a kernel without transparent huge pages refuses it, and 4 KiB pages serve.
  (void)madvise(base_, capacity_, MADV_HUGEPAGE);
}

size_t Arena::committed_bytes() const {
  if (!is_reserved()) return capacity_;
  size_t total = 0;
  for (const auto& [b, e] : committed_) total += e - b;
  return total;
}

void Arena::release() noexcept {
  if (reservation_) {
    reservation_.reset();
  } else if (is_reserved()) {
    if (base_) {
      count_host_arena(committed_bytes(), false);
      munmap(base_, capacity_);
    }
  } else if (device_ == Device::CUDA) {
    device_free(base_);
  } else if (base_) {
    count_host_arena(capacity_, false);
    std::free(base_);
  }
  base_ = nullptr;
  granule_ = 0;
  committed_.clear();
}

Arena::~Arena() {
  release();
}

Arena::Arena(Arena&& other) noexcept {
  *this = std::move(other);
}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    used_ = std::exchange(other.used_, 0);
    high_water_ = std::exchange(other.high_water_, 0);
    device_ = other.device_;
    measuring_ = other.measuring_;
    granule_ = std::exchange(other.granule_, 0);
    committed_ = std::exchange(other.committed_, {});
    reservation_ = std::move(other.reservation_);
  }
  return *this;
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.dtype = dtype;
  t.device = device_;
  t.shape = shape;
  size_t bytes = aligned(t.bytes());
  PENTAD_CHECK(measuring_ || used_ + bytes <= capacity_,
               "arena {} overflow: {} used + {} requested > {}", name_, used_, bytes, capacity_);
  t.data = measuring_ ? nullptr : static_cast<char*>(base_) + used_;
  used_ += bytes;
  if (used_ > high_water_) high_water_ = used_;
  return t;
}

void Arena::zero() {
  if (!base_) return;
  if (is_reserved()) {
    for (const auto& [b, e] : committed_) discard_backed(b, e);
    return;
  }
  if (device_ == Device::CUDA)
    device_zero(base_, capacity_);
  else
    std::memset(base_, 0, capacity_);
}

void Arena::discard(size_t begin, size_t end) {
  PENTAD_CHECK(begin <= end && end <= capacity_, "{} arena: discard [{}, {}) of {} bytes", name_,
               begin, end, capacity_);
  if (!base_ || begin == end) return;
  if (!is_reserved()) return discard_backed(begin, end);
  for (const auto& [b, e] : committed_)
    if (std::max(b, begin) < std::min(e, end)) discard_backed(std::max(b, begin), std::min(e, end));
}

void Arena::discard_backed(size_t begin, size_t end) {
  char* const base = static_cast<char*>(base_);
  if (device_ == Device::CUDA) {
    device_zero(base + begin, end - begin);
    return;
  }
  const size_t page_begin = (begin + kPageBytes - 1) / kPageBytes * kPageBytes;
  const size_t page_end = end / kPageBytes * kPageBytes;
  if (page_begin >= page_end || reinterpret_cast<uintptr_t>(base) % kPageBytes != 0) {
    std::memset(base + begin, 0, end - begin);
    return;
  }
  std::memset(base + begin, 0, page_begin - begin);
  std::memset(base + page_end, 0, end - page_end);
  // Private anonymous memory reads as zeros after DONTNEED; if the kernel refuses, zero it.
  if (madvise(base + page_begin, page_end - page_begin, MADV_DONTNEED) != 0)
    std::memset(base + page_begin, 0, page_end - page_begin);
}

bool poison_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("PENTAD_POISON");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return enabled;
}

void poison_host(void* data, size_t bytes) {
  if (data && poison_enabled()) std::memset(data, 0xff, bytes);
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace pentad
