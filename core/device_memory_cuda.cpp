// Device memory through the CUDA runtime (linked in builds with CUDA).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/device_memory.h"

namespace pentad {

namespace {
void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) fail("CUDA error in {}: {}", call, cudaGetErrorString(rc));
}
std::atomic<int64_t> waits{0};

// The allocation counters: allocations are few (arenas, workspaces), so one lock will do.
struct Held {
  std::mutex mutex;
  std::unordered_map<const void*, std::pair<size_t, bool>> sizes;  // bytes, is an arena
  DeviceMemoryUse use;
};
Held& held() {
  static Held h;
  return h;
}
bool is_arena(const std::string& what) {
  return what.ends_with(" arena");
}
void count_allocation(const void* ptr, size_t bytes, bool arena) {
  Held& h = held();
  std::lock_guard lock(h.mutex);
  h.sizes[ptr] = {bytes, arena};
  h.use.bytes += bytes;
  h.use.peak_bytes = std::max(h.use.peak_bytes, h.use.bytes);
  if (arena) {
    h.use.arena_bytes += bytes;
    h.use.arena_peak_bytes = std::max(h.use.arena_peak_bytes, h.use.arena_bytes);
  }
}
void count_free(const void* ptr) {
  Held& h = held();
  std::lock_guard lock(h.mutex);
  auto it = h.sizes.find(ptr);
  if (it == h.sizes.end()) return;
  h.use.bytes -= it->second.first;
  if (it->second.second) h.use.arena_bytes -= it->second.first;
  h.sizes.erase(it);
}
}  // namespace

DeviceMemoryUse device_memory_use() {
  Held& h = held();
  std::lock_guard lock(h.mutex);
  return h.use;
}

void reset_device_memory_peak() {
  Held& h = held();
  std::lock_guard lock(h.mutex);
  h.use.peak_bytes = h.use.bytes;
  h.use.arena_peak_bytes = h.use.arena_bytes;
}

int64_t device_waits() {
  return waits.load();
}

void count_device_wait() {
  ++waits;
}

int cuda_device_count() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return devices;
}

void* device_alloc(size_t bytes, const std::string& what) {
  count_device_wait();
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, bytes);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    fail("cannot allocate {} of CUDA device memory for {}: {}", format_bytes(bytes), what,
         cudaGetErrorString(rc));
  }
  count_allocation(ptr, bytes, is_arena(what));
  return ptr;
}

void device_free(void* ptr) noexcept {
  if (!ptr) return;
  count_device_wait();  // cudaFree synchronises the device
  count_free(ptr);
  cudaFree(ptr);
}

void device_zero(void* ptr, size_t bytes) {
  if (bytes) check(cudaMemset(ptr, 0, bytes), "cudaMemset");
}

void device_fill_ones(void* ptr, size_t bytes) {
  if (bytes) check(cudaMemset(ptr, 0xff, bytes), "cudaMemset");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // To or from pageable host memory the host waits; device to device it does not.
  if (dst_device == Device::CPU || src_device == Device::CPU) count_device_wait();
  const cudaMemcpyKind kind = dst_device == Device::CPU   ? cudaMemcpyDeviceToHost
                              : src_device == Device::CPU ? cudaMemcpyHostToDevice
                                                          : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device) {
  if (width == 0 || rows == 0) return;
  if (device == Device::CPU) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
    return;
  }
  check(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice),
        "cudaMemcpy2D");
}

void copy(const Tensor& dst, const Tensor& src) {
  PENTAD_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: {} {} into {} {}",
               dtype_name(src.dtype), src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

namespace {
// The driver's virtual memory calls, looked up through the runtime: linking libcuda itself
// would stop every program of a CUDA build from starting on a machine without the driver.
template <typename F>
F driver_call(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess || !fn)
    fail("the CUDA driver has no {} (the virtual memory API needs CUDA 10.2 or newer)", symbol);
  return reinterpret_cast<F>(fn);
}

struct VirtualMemory {
  decltype(&::cuMemGetAllocationGranularity) granularity =
      driver_call<decltype(granularity)>("cuMemGetAllocationGranularity");
  decltype(&::cuMemAddressReserve) reserve = driver_call<decltype(reserve)>("cuMemAddressReserve");
  decltype(&::cuMemAddressFree) unreserve = driver_call<decltype(unreserve)>("cuMemAddressFree");
  decltype(&::cuMemCreate) create = driver_call<decltype(create)>("cuMemCreate");
  decltype(&::cuMemRelease) release = driver_call<decltype(release)>("cuMemRelease");
  decltype(&::cuMemMap) map = driver_call<decltype(map)>("cuMemMap");
  decltype(&::cuMemUnmap) unmap = driver_call<decltype(unmap)>("cuMemUnmap");
  decltype(&::cuMemSetAccess) access = driver_call<decltype(access)>("cuMemSetAccess");
};

const VirtualMemory& vmm() {
  static const VirtualMemory calls;
  return calls;
}

void check_driver(CUresult rc, const char* call, const std::string& what) {
  if (rc != CUDA_SUCCESS) fail("CUDA driver error {} in {} for {}", int(rc), call, what);
}

CUmemAllocationProp device_memory_on(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
}  // namespace

DeviceReservation::DeviceReservation(size_t bytes, const std::string& what) : what_(what) {
  count_device_wait();  // as cudaMalloc: setting up may wait
  check(cudaGetDevice(&device_), "cudaGetDevice");
  const CUmemAllocationProp prop = device_memory_on(device_);
  check_driver(vmm().granularity(&granule_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity", what_);
  bytes_ = std::max<size_t>(granule_, (bytes + granule_ - 1) / granule_ * granule_);
  CUdeviceptr base = 0;
  check_driver(vmm().reserve(&base, bytes_, granule_, 0, 0), "cuMemAddressReserve", what_);
  base_ = reinterpret_cast<void*>(base);
}

DeviceReservation::~DeviceReservation() {
  if (!base_) return;
  count_device_wait();  // unmapping waits for the device
  for (const Mapping& m : mappings_) {
    vmm().unmap(reinterpret_cast<CUdeviceptr>(base_) + m.offset, m.bytes);
    vmm().release(CUmemGenericAllocationHandle(m.handle));
    count_free(static_cast<const char*>(base_) + m.offset);
  }
  vmm().unreserve(reinterpret_cast<CUdeviceptr>(base_), bytes_);
}

void DeviceReservation::map(size_t offset, size_t bytes) {
  PENTAD_CHECK(offset % granule_ == 0 && bytes % granule_ == 0 && offset + bytes <= bytes_,
               "{}: map [{}, {}) is not whole granules of {} inside {}", what_, offset,
               offset + bytes, granule_, bytes_);
  count_device_wait();
  const CUmemAllocationProp prop = device_memory_on(device_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult rc = vmm().create(&handle, bytes, &prop, 0);
  if (rc != CUDA_SUCCESS)
    fail("cannot allocate {} of CUDA device memory for {}: driver error {}", format_bytes(bytes),
         what_, int(rc));
  const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(base_) + offset;
  check_driver(vmm().map(at, bytes, 0, handle, 0), "cuMemMap", what_);
  mappings_.push_back({offset, bytes, handle});
  count_allocation(static_cast<const char*>(base_) + offset, bytes, is_arena(what_));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check_driver(vmm().access(at, bytes, &access, 1), "cuMemSetAccess", what_);
}

int select_cuda_device(int local_rank) {
  const int devices = cuda_device_count();
  if (devices == 0)
    fail(
        "train.device = \"cuda\" but no CUDA device is visible (check the driver, "
        "CUDA_VISIBLE_DEVICES, or train on the CPU)");
  const int device = local_rank % devices;
  check(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

std::string cuda_device_description() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return fmt::format("{} (device {}), {}, sm_{}{}", prop.name, device,
                     format_bytes(prop.totalGlobalMem), prop.major, prop.minor);
}

std::string cuda_device_pci_bus_id() {
  if (cuda_device_count() == 0) return "";
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  char id[32] = {};
  check(cudaDeviceGetPCIBusId(id, int(sizeof(id)), device), "cudaDeviceGetPCIBusId");
  return id;
}

void device_synchronize() {
  count_device_wait();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void host_pin(void* ptr, size_t bytes) {
  if (bytes == 0 || cuda_device_count() == 0) return;
  count_device_wait();
  check(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
}

void host_unpin(void* ptr) noexcept {
  if (ptr && cuda_device_count() > 0) {
    if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
  }
}

AsyncCopier::AsyncCopier() = default;

AsyncCopier::~AsyncCopier() {
  if (stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void AsyncCopier::begin_after_compute() {
  if (cuda_device_count() == 0) return;
  if (!stream_) {
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = stream;
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    event_ = event;
  }
  // The kernels run on the legacy default stream (kernels/cuda/cuda_ops.h).
  check(cudaEventRecord(static_cast<cudaEvent_t>(event_), cudaStreamLegacy), "cudaEventRecord");
  check(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event_), 0),
      "cudaStreamWaitEvent");
}

void AsyncCopier::copy(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  PENTAD_CHECK(stream_, "AsyncCopier: begin_after_compute() must come before device copies");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
        "cudaMemcpyAsync");
}

void AsyncCopier::synchronize() {
  if (!stream_) return;
  count_device_wait();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

UploadStaging::~UploadStaging() {
  for (Block& b : blocks_) cudaFreeHost(b.host);
}

void UploadStaging::copy(void* dst_device, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  while (current_ < blocks_.size() && blocks_[current_].used + bytes > blocks_[current_].bytes)
    ++current_;
  if (current_ == blocks_.size()) {
    Block b;
    b.bytes = std::max<size_t>(bytes, size_t{1} << 20);
    count_device_wait();
    check(cudaMallocHost(&b.host, b.bytes), "cudaMallocHost (upload staging)");
    blocks_.push_back(b);
  }
  Block& b = blocks_[current_];
  char* staged = b.host + b.used;
  b.used += (bytes + 255) / 256 * 256;
  std::memcpy(staged, src_host, bytes);
  check(cudaMemcpyAsync(dst_device, staged, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy),
        "cudaMemcpyAsync (upload)");
}

void UploadStaging::rewind() {
  for (Block& b : blocks_) b.used = 0;
  current_ = 0;
}

StagedUpload::StagedUpload(int slots, size_t bytes) : slots_(size_t(slots)), slot_bytes_(bytes) {
  PENTAD_CHECK(slots >= 1, "StagedUpload: {} slots", slots);
  for (Slot& s : slots_) {
    count_device_wait();  // cudaMallocHost synchronises
    check(cudaMallocHost(&s.host, std::max<size_t>(bytes, 1)), "cudaMallocHost (staged upload)");
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    s.event = event;
  }
}

StagedUpload::~StagedUpload() {
  for (Slot& s : slots_) {
    // A copy still queued reads the slot: it must be done before the memory goes.
    if (s.event) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(s.event));
      cudaEventDestroy(static_cast<cudaEvent_t>(s.event));
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void* StagedUpload::stage(size_t bytes) {
  PENTAD_CHECK(bytes <= slot_bytes_, "StagedUpload: {} bytes into slots of {}", bytes, slot_bytes_);
  Slot& s = slots_[next_];
  if (s.pending) {
    const auto event = static_cast<cudaEvent_t>(s.event);
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady) {  // the device is a whole ring behind: wait for it
      count_device_wait();
      check(cudaEventSynchronize(event), "cudaEventSynchronize (staged upload)");
    } else {
      check(rc, "cudaEventQuery (staged upload)");
    }
    s.pending = false;
  }
  staged_ = next_;
  staged_bytes_ = bytes;
  next_ = (next_ + 1) % slots_.size();
  return s.host;
}

void StagedUpload::upload(void* dst_device) {
  Slot& s = slots_[staged_];
  PENTAD_CHECK(!s.pending, "StagedUpload: upload() without a stage() before it");
  if (staged_bytes_ == 0) return;
  // The kernels and NCCL's stream ordering both key on the legacy default stream.
  check(
      cudaMemcpyAsync(dst_device, s.host, staged_bytes_, cudaMemcpyHostToDevice, cudaStreamLegacy),
      "cudaMemcpyAsync (staged upload)");
  check(cudaEventRecord(static_cast<cudaEvent_t>(s.event), cudaStreamLegacy),
        "cudaEventRecord (staged upload)");
  s.pending = true;
}

HostStaging::~HostStaging() {
  for (Block& b : blocks_) {
    // An upload still queued reads the block: it must be done before the memory goes.
    if (b.event) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(b.event));
      cudaEventDestroy(static_cast<cudaEvent_t>(b.event));
    }
    if (b.pinned)
      cudaFreeHost(b.host);
    else
      ::operator delete(b.host);
  }
}

void* HostStaging::acquire(size_t bytes, bool pinned) {
  pinned = pinned && cuda_device_count() > 0;
  Block* best = smallest_free(bytes, pinned);
  if (!best) {
    Block b;
    b.bytes = new_block_bytes(bytes);
    b.pinned = pinned;
    if (b.pinned) {
      count_device_wait();  // cudaMallocHost synchronises
      void* host = nullptr;
      check(cudaMallocHost(&host, b.bytes), "cudaMallocHost (communicator staging)");
      b.host = static_cast<char*>(host);
    } else {
      b.host = static_cast<char*>(::operator new(b.bytes));
    }
    blocks_.push_back(b);
    best = &blocks_.back();
  }
  if (best->pending) {  // the device has not yet run the uploads from its last use
    const auto event = static_cast<cudaEvent_t>(best->event);
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady) {
      count_device_wait();
      check(cudaEventSynchronize(event), "cudaEventSynchronize (communicator staging)");
    } else {
      check(rc, "cudaEventQuery (communicator staging)");
    }
    best->pending = false;
  }
  best->in_use = true;
  best->uploads = false;
  return best->host;
}

void HostStaging::release(void* block) {
  Block& b = block_of(block, 0);
  b.in_use = false;
  if (!b.uploads) return;
  if (!b.event) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    b.event = event;
  }
  // The kernels run on the legacy default stream, and so do the uploads (upload()).
  check(cudaEventRecord(static_cast<cudaEvent_t>(b.event), cudaStreamLegacy),
        "cudaEventRecord (communicator staging)");
  b.pending = true;
}

void HostStaging::download(void* at, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  Block& b = block_of(at, bytes);
  if (src_device == Device::CPU) {
    std::memcpy(at, src, bytes);
    return;
  }
  // An explicit direction: a host pointer labelled CUDA is an error here, not a host copy.
  check(cudaMemcpyAsync(at, src, bytes, b.pinned ? cudaMemcpyDeviceToHost : cudaMemcpyDefault,
                        cudaStreamLegacy),
        "cudaMemcpyAsync (communicator staging, from the device)");
  downloads_queued_ = true;
}

void HostStaging::wait_downloads() {
  if (!downloads_queued_) return;
  downloads_queued_ = false;
  count_device_wait();
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (communicator staging)");
}

void HostStaging::upload(void* dst, Device dst_device, const void* at, size_t bytes) {
  if (bytes == 0) return;
  Block& b = block_of(at, bytes);
  if (dst_device == Device::CPU) {
    std::memcpy(dst, at, bytes);
    return;
  }
  check(cudaMemcpyAsync(dst, at, bytes, b.pinned ? cudaMemcpyHostToDevice : cudaMemcpyDefault,
                        cudaStreamLegacy),
        "cudaMemcpyAsync (communicator staging, to the device)");
  b.uploads = true;
}

StepReadback::~StepReadback() {
  if (host_) cudaFreeHost(host_);
}

const void* StepReadback::read(const void* device_src, size_t bytes) {
  if (bytes > capacity_) {
    if (host_) check(cudaFreeHost(host_), "cudaFreeHost (readback)");
    host_ = nullptr;
    capacity_ = 0;
    count_device_wait();
    check(cudaMallocHost(&host_, bytes), "cudaMallocHost (readback)");
    capacity_ = bytes;
  }
  count_device_wait();
  check(cudaMemcpyAsync(host_, device_src, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy),
        "cudaMemcpyAsync (readback)");
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (readback)");
  return host_;
}

}  // namespace pentad
