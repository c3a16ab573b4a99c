// Device memory through the CUDA runtime (linked in builds with CUDA), the allocating half:
// what this process holds (the counters and the host waits), cudaMalloc and reserved
// address ranges, fills, and which device a thread works on. The copies and the host
// staging are device_copy_cuda.cpp's.
#include "core/device_memory_cuda.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/device_memory.h"

namespace pentad {

namespace {
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

size_t cuda_device_memory_bytes() {
  if (cuda_device_count() == 0) return 0;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.totalGlobalMem;
}

void device_synchronize() {
  count_device_wait();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace pentad
