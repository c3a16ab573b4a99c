#pragma once
// Shared by the CUDA kernels: element conversion, warp and block reductions, the device
// context (stream, scratch buffer, error checks) and dispatch on the element type.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/tensor.h"
#include "kernels/cuda/tiling.h"

namespace pentad::kernels::cuda {

using bf16 = __nv_bfloat16;

// ---- host side (context.cu) ----

// Throws pentad::Error naming `what` when rc is not cudaSuccess.
void check(cudaError_t rc, const char* what);
// After a kernel launch: reports a bad launch configuration at once. Faults inside the
// kernel surface at the next synchronising call.
void check_launch(const char* kernel);
// The stream every kernel runs on (the stream rule of cuda_ops.h).
cudaStream_t stream();
// One scratch buffer per device, at least `bytes` long, valid until the next call. Kernels
// of one op use it in stream order; it grows (after a device synchronisation) and never
// shrinks.
void* scratch(size_t bytes);
// Raises the dynamic shared memory limit of `kernel` when `bytes` is above the default 48 KiB.
void allow_shared_memory(const void* kernel, size_t bytes);
// Adds column partial sums, (chunks, C) rows in F32, into out (C) in chunk order (norms.cu).
void add_column_partials(float* out, const float* partials, int64_t chunks, int64_t C);

template <typename T>
struct Tag {
  using type = T;
};
// Calls f(Tag<float>) or f(Tag<bf16>) for the data dtype (checked at kernels/door.h).
template <typename F>
void by_dtype(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(Tag<bf16>{});
  else
    f(Tag<float>{});
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// ---- device side ----

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

// kWidth consecutive elements moved as one access: 16 bytes (8 BF16 or 4 F32, one 128-bit
// load or store) where the address allows it, kWidth = 1 elsewhere.
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));
template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T v[kWidth];
};
// Global memory only. Through uint4 where a pack is 16 bytes: a plain store of a pack, or
// even of a uint4, compiled (CUDA 13.0) to 2- or 4-byte stores; __stwb (st.global.wb, the
// default cache policy) keeps it one 16-byte store.
template <typename T, int kWidth>
__device__ __forceinline__ Pack<T, kWidth> load_pack(const T* p) {
  Pack<T, kWidth> x;
  if constexpr (sizeof(x) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    memcpy(&x, &u, 16);
  } else {
    x = *reinterpret_cast<const Pack<T, kWidth>*>(p);
  }
  return x;
}
__device__ __forceinline__ uint32_t word_of(float a) {
  return __float_as_uint(a);
}
__device__ __forceinline__ uint32_t word_of(bf16 a, bf16 b) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(a)) |
         static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16;
}
template <typename T, int kWidth>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kWidth>& x) {
  if constexpr (sizeof(x) == 16 && std::is_same_v<T, float>) {
    __stwb(reinterpret_cast<uint4*>(p),
           make_uint4(word_of(x.v[0]), word_of(x.v[1]), word_of(x.v[2]), word_of(x.v[3])));
  } else if constexpr (sizeof(x) == 16) {
    __stwb(reinterpret_cast<uint4*>(p),
           make_uint4(word_of(x.v[0], x.v[1]), word_of(x.v[2], x.v[3]), word_of(x.v[4], x.v[5]),
                      word_of(x.v[6], x.v[7])));
  } else {
    *reinterpret_cast<Pack<T, kWidth>*>(p) = x;
  }
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Block-wide sum and max for blockDim.x a multiple of 32: every thread gets the result, in
// the same order of additions whatever the timing. `shared` holds 32 values; the leading
// barrier lets one buffer serve consecutive calls.
template <typename V>
__device__ V block_sum(V x, V* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : V(0));
}
__device__ inline float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_max(lane < warps ? shared[lane] : -INFINITY);
}

}  // namespace pentad::kernels::cuda
