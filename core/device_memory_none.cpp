// Device memory in builds without CUDA: there is no device, and nothing can be allocated
// on one. Host-to-host copies still work.
#include <algorithm>
#include <cstring>

#include "core/device_memory.h"

namespace pentad {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  fail(
      "{}: this build has no CUDA backend (CMake found no nvcc); rebuild with CUDA or keep "
      "the run on the CPU",
      what);
}
}  // namespace

int cuda_device_count() {
  return 0;
}

DeviceMemoryUse device_memory_use() {
  return {};  // nothing is ever allocated on a device here
}

void reset_device_memory_peak() {}

void* device_alloc(size_t bytes, const std::string& what) {
  no_cuda(what.c_str());
}

void device_free(void*) noexcept {}

void device_zero(void*, size_t bytes) {
  if (bytes) no_cuda("device_zero");
}

void device_fill_ones(void*, size_t bytes) {
  if (bytes) no_cuda("device_fill_ones");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device != Device::CPU || src_device != Device::CPU) no_cuda("copy");
  std::memcpy(dst, src, bytes);
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device) {
  if (width == 0 || rows == 0) return;
  if (device != Device::CPU) no_cuda("copy");
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                static_cast<const char*>(src) + r * src_pitch, width);
}

void copy(const Tensor& dst, const Tensor& src) {
  PENTAD_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: {} {} into {} {}",
               dtype_name(src.dtype), src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

DeviceReservation::DeviceReservation(size_t, const std::string& what) {
  no_cuda(what.c_str());
}

DeviceReservation::~DeviceReservation() = default;

void DeviceReservation::map(size_t, size_t) {
  no_cuda("DeviceReservation::map");
}

int select_cuda_device(int) {
  no_cuda("train.device = \"cuda\"");
}

std::string cuda_device_description() {
  return "no CUDA device (CUDA not built)";
}

std::string cuda_device_pci_bus_id() {
  return "";
}

size_t cuda_device_memory_bytes() {
  return 0;
}

void device_synchronize() {}

void host_pin(void*, size_t) {}
void host_unpin(void*) noexcept {}

AsyncCopier::AsyncCopier() = default;
AsyncCopier::~AsyncCopier() = default;
void AsyncCopier::begin_after_compute() {}

void AsyncCopier::copy(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes) {
  copy_bytes(dst, dst_device, src, src_device, bytes);
}

void AsyncCopier::synchronize() {}
size_t AsyncCopier::mark() {
  return 0;
}
void AsyncCopier::wait(size_t) {}

int64_t device_waits() {
  return 0;
}

void count_device_wait() {}

UploadStaging::~UploadStaging() = default;

void UploadStaging::copy(void*, const void*, size_t bytes) {
  if (bytes) no_cuda("copy to the device");
}

void UploadStaging::rewind() {}

StagedUpload::StagedUpload(int, size_t) {
  no_cuda("page-locked staging for uploads to the device");
}
StagedUpload::~StagedUpload() = default;

void* StagedUpload::stage(size_t) {
  no_cuda("upload to the device");
}

void StagedUpload::upload(void*) {
  no_cuda("upload to the device");
}

// Host memory only: every copy is a memcpy, and a device tensor cannot get here.
HostStaging::~HostStaging() {
  for (Block& b : blocks_) ::operator delete(b.host);
}

void* HostStaging::acquire(size_t bytes, bool) {
  Block* best = smallest_free(bytes, false);
  if (!best) {
    Block b;
    b.bytes = new_block_bytes(bytes);
    b.host = static_cast<char*>(::operator new(b.bytes));
    blocks_.push_back(b);
    best = &blocks_.back();
  }
  best->in_use = true;
  return best->host;
}

void HostStaging::release(void* block) {
  acquired(block).in_use = false;
}

void HostStaging::download(void* at, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  block_of(at, bytes);
  if (src_device != Device::CPU) no_cuda("communicator staging from the device");
  std::memcpy(at, src, bytes);
}

void HostStaging::wait_downloads() {}

void HostStaging::upload(void* dst, Device dst_device, const void* at, size_t bytes) {
  if (bytes == 0) return;
  block_of(at, bytes);
  if (dst_device != Device::CPU) no_cuda("communicator staging to the device");
  std::memcpy(dst, at, bytes);
}

StepReadback::~StepReadback() = default;

const void* StepReadback::read(const void*, size_t) {
  no_cuda("readback from the device");
}

}  // namespace pentad
