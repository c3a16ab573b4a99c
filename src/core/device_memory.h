#pragma once
// Device memory: the one place that allocates, frees, fills and copies memory on a CUDA
// device. Builds with CUDA link device_memory_cuda.cpp; builds without it link
// device_memory_none.cpp, which sees no device and refuses to allocate, so no caller needs
// an #ifdef. Every call works on the current CUDA device and waits for completion
// (cudaMemcpy and cudaMemset order with the legacy default stream the kernels run on).
#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace pentad {

// Visible CUDA devices; 0 when there is none, no driver, or CUDA is not built.
int cuda_device_count();

// cudaMalloc; fails with a message naming `what` and the size.
void* device_alloc(size_t bytes, const std::string& what);
void device_free(void* ptr) noexcept;
void device_zero(void* ptr, size_t bytes);
// Fills with 0xff bytes: NaN in f32 and bf16 (tests poison outputs with it).
void device_fill_ones(void* ptr, size_t bytes);

// Copies bytes between any two devices (host or CUDA).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Copies src into dst: same dtype and element count, any devices.
void copy(const Tensor& dst, const Tensor& src);

}  // namespace pentad
