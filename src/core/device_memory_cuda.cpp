// Device memory through the CUDA runtime (linked in builds with CUDA).
#include <cuda_runtime.h>

#include <cstring>

#include "core/device_memory.h"

namespace pentad {

namespace {
void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) fail("CUDA error in {}: {}", call, cudaGetErrorString(rc));
}
}  // namespace

int cuda_device_count() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error, report none
    return 0;
  }
  return devices;
}

void* device_alloc(size_t bytes, const std::string& what) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, bytes);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    fail("cannot allocate {} of CUDA device memory for {}: {}", format_bytes(bytes), what,
         cudaGetErrorString(rc));
  }
  return ptr;
}

void device_free(void* ptr) noexcept {
  if (ptr) cudaFree(ptr);
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
  const cudaMemcpyKind kind = dst_device == Device::CPU   ? cudaMemcpyDeviceToHost
                              : src_device == Device::CPU ? cudaMemcpyHostToDevice
                                                          : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

void copy(const Tensor& dst, const Tensor& src) {
  PENTAD_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: {} {} into {} {}",
               dtype_name(src.dtype), src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

}  // namespace pentad
