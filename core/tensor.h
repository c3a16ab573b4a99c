#pragma once
// Tensors are views: a pointer into an arena plus dtype, shape and device. They own
// nothing; the arena that handed out the memory outlives them.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"

namespace pentad {

enum class DType : uint8_t { F32, F64, BF16, I32, U16 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_bytes(DType dtype);
const char* dtype_name(DType dtype);
const char* device_name(Device device);

constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "(4, 256)"
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_bytes(dtype); }
  int64_t dim(int i) const { return shape[i]; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // The same memory seen with another shape of equal element count.
  Tensor reshaped(Shape new_shape) const {
    PENTAD_CHECK(new_shape.numel() == numel(), "reshape {} to {}", shape.str(), new_shape.str());
    Tensor t = *this;
    t.shape = new_shape;
    return t;
  }
  // Rows [begin, begin + count) along the first dim, as a view.
  Tensor rows(int64_t begin, int64_t count) const {
    PENTAD_CHECK(shape.ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0],
                 "rows [{}, {}) of {}", begin, begin + count, shape.str());
    Tensor t = *this;
    t.shape.dims[0] = count;
    if (begin > 0)
      t.data = static_cast<char*>(data) +
               static_cast<size_t>(begin) * (bytes() / static_cast<size_t>(shape[0]));
    return t;
  }
  // The first shape.numel() elements seen as `shape` (a buffer planned for the largest use).
  Tensor prefix(Shape new_shape) const {
    PENTAD_CHECK(new_shape.numel() <= numel(), "prefix {} of {}", new_shape.str(), shape.str());
    Tensor t = *this;
    t.shape = new_shape;
    return t;
  }
  float* f32() const {
    PENTAD_CHECK(dtype == DType::F32, "tensor is {}", dtype_name(dtype));
    return static_cast<float*>(data);
  }
};

// A view of memory that something else owns (host memory unless told otherwise).
inline Tensor view_of(void* data, Shape shape, DType dtype = DType::F32,
                      Device device = Device::CPU) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.shape = shape;
  return t;
}

// A bump allocator over one allocation. Sizes are planned up front (the memory plan is
// printed before training), so running out is a planning bug, not a user error.
// Device::CUDA arenas hold device memory (core/device_memory.h); their tensors are CUDA
// tensors, which only the kernels and the NCCL communicator may dereference.
class DeviceReservation;

// What the arenas in host memory hold (a reserved arena: its committed pages), and the most
// they held since the last reset: the CPU's counterpart of device_memory_use()'s arena
// figures (core/device_memory.h), against which tests check the memory plan.
struct HostArenaUse {
  size_t bytes = 0, peak_bytes = 0;
};
HostArenaUse host_arena_use();
void reset_host_arena_peak();  // the peak restarts from what is held now

class Arena {
 public:
  Arena();
  Arena(std::string name, size_t bytes, Device device = Device::CPU);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;

  // An arena that only counts: alloc() returns tensors without memory. Running the same
  // allocation code against it gives the exact size to plan and print.
  static Arena measuring(std::string name);
  // An arena of reserved addresses with no memory behind them until commit() backs a part
  // (ZeRO: each rank backs only its shares of the parameters, and nothing of the full-size
  // gradients). Host: PROT_NONE pages made readable and writable; CUDA: the virtual memory
  // API, mapped in granules (2 MiB). Committed parts are never given back before the arena
  // goes (unmapping device memory waits for the device), so commit what is kept. A read or
  // write outside them faults, on the host as on the device: no stray access goes unseen.
  static Arena reserved(std::string name, size_t bytes, Device device = Device::CPU);
  // Backs bytes [begin, end), widened to whole granules, with zeros; parts already backed
  // stay as they are.
  void commit(size_t begin, size_t end);
  // A host arena written whole and discarded whole again and again (ZeRO's unit buffers):
  // the kernel backs its aligned 2 MiB extents with huge pages, so writing it after a discard
  // faults once an extent instead of once a 4 KiB page (the zeroing is the same). No-op on a
  // device, below 2 MiB, or where transparent huge pages are off.
  void prefer_huge_pages();
  bool is_reserved() const { return granule_ != 0; }
  size_t committed_bytes() const;  // a reserved arena's backed bytes; others: the capacity

  Tensor alloc(Shape shape, DType dtype = DType::F32);
  void reset();
  void zero();  // a reserved arena: its committed parts
  // Bytes [begin, end) become zeros (a reserved arena: those committed). On the host, the whole
  // pages among them go back to the system (madvise DONTNEED) and count for nothing until written
  // again: ZeRO-2's gradient buffer holds physical memory only for the buckets backward has not yet
  // reduced.
  void discard(size_t begin, size_t end);

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t high_water() const { return high_water_; }
  const std::string& name() const { return name_; }
  void* base() const { return base_; }
  Device device() const { return device_; }

  static constexpr size_t kAlignment = 64;
  static constexpr size_t kPageBytes = 4096, kPageThreshold = size_t{1} << 20;  // host arenas
  static size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  void release() noexcept;                        // frees base_ on its device
  void discard_backed(size_t begin, size_t end);  // discard() of memory known to be there

  std::string name_;
  void* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t high_water_ = 0;
  Device device_ = Device::CPU;
  bool measuring_ = false;
  size_t granule_ = 0;  // reserved arenas: the unit of commit(); 0: an ordinary arena
  std::vector<std::pair<size_t, size_t>> committed_;  // byte ranges, ascending, disjoint
  std::unique_ptr<DeviceReservation> reservation_;    // a reserved CUDA arena's mappings
};

std::string format_bytes(size_t bytes);  // "12.3 MiB"

// Poison mode (environment PENTAD_POISON=1, read once): every arena and staging buffer is
// filled with 0xff bytes when it is allocated, and an arena again at reset(). 0xff..ff is
// NaN in f32, bf16 and f64, so a read before the first write shows up as a NaN loss or
// gradient even where the value is multiplied by zero, instead of depending on what the
// heap happened to hold. Costs one pass over each buffer at allocation: tests only.
bool poison_enabled();
void poison_host(void* data, size_t bytes);  // no-op unless poison_enabled()

}  // namespace pentad
