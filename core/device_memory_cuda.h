#pragma once
// What the two files of the CUDA device-memory backend share (device_memory_cuda.cpp:
// allocation and the counters; device_copy_cuda.cpp: copies and host staging). Included by
// those two only; callers see core/device_memory.h.
#include <cuda_runtime.h>

#include "core/check.h"

namespace pentad {

// Fails with the runtime's message naming `call` when rc is not cudaSuccess. Inline: the
// unity build compiles both files as one source.
inline void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) fail("CUDA error in {}: {}", call, cudaGetErrorString(rc));
}

}  // namespace pentad
