// The device context of the CUDA kernels: errors, stream, scratch memory, argument checks.
#include <array>

#include "core/device_memory.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct Scratch {
  void* data = nullptr;
  size_t bytes = 0;
};

// Per device; never freed (the process exit releases device memory, and freeing it from a
// static destructor can run after the CUDA runtime has shut down).
Scratch& scratch_of_current_device() {
  static std::array<Scratch, kMaxDevices> scratch;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  PENTAD_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {}", device);
  return scratch[static_cast<size_t>(device)];
}

}  // namespace

void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  fail("CUDA error in {}: {}", what, cudaGetErrorString(rc));
}

void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

cudaStream_t stream() {
  return nullptr;
}  // the legacy default stream

void* scratch(size_t bytes) {
  Scratch& s = scratch_of_current_device();
  if (bytes <= s.bytes) return s.data;
  // Kernels queued earlier may still read the old buffer.
  count_device_wait();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (growing the scratch buffer)");
  device_free(s.data);  // through pentad's allocator, so that device_memory_use() counts it
  s.data = nullptr;
  s.bytes = 0;
  const size_t grown = std::max<size_t>(bytes, size_t{1} << 20);
  s.data = device_alloc(grown, "the kernels' scratch");
  s.bytes = grown;
  return s.data;
}

void allow_shared_memory(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "cudaFuncSetAttribute (dynamic shared memory)");
}

void require_device_memory(const char* op, const char* name, const Tensor& t) {
  cudaPointerAttributes attributes{};
  const cudaError_t rc = cudaPointerGetAttributes(&attributes, t.data);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    fail("{}: '{}' is a CUDA tensor, but CUDA cannot run here: {}", op, name,
         cudaGetErrorString(rc));
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    fail("{}: '{}' is a CUDA tensor, but its memory is not CUDA device memory", op, name);
}

}  // namespace pentad::kernels::cuda
