// Softmax + cross-entropy fused with its gradient, whole-vocabulary and vocabulary-parallel.
// One block per row, 16-byte accesses (8 BF16 or 4 F32 logits) over the part of the row that
// starts on 16 bytes, single elements over the few before and after (split_row): any V, any
// row alignment (V = 50257 puts every other BF16 row off 16 bytes).
//
// The whole-vocabulary kernel reads its row once: one pass keeps a running max and the sum of
// exponentials rescaled to it (online softmax), and where the row fits (kMaxCachedRowBytes:
// BF16 up to 56K classes, F32 up to 28K) copies it into shared memory, so that the gradient
// pass reads it from there; longer rows are read a second time (from L2, mostly). The model
// passes its logits as dlogits (the classifier GEMM's output buffer then holds the gradient
// that the classifier's backward reads), so the logits cross memory twice in all: written by
// the GEMM, read here, and the gradient written here, read by the backward GEMM.
//
// dlogits may alias logits: every element is read (into registers or shared memory) before
// the thread that read it writes it, the target logit is read before the first barrier, and
// the one-hot term is written by the thread that wrote the target's element, after it.
// Every reduction has a fixed order: results are bitwise the same for a fixed shape (and
// row alignment, which the arenas fix).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

// 512 threads a row: 12 or 13 accesses each over GPT-2's 50304 BF16 logits; with a cached
// row of 98 KiB, two blocks an SM (of Hopper's 228 KiB) keep 1024 threads and 2 x 4 x 8 KiB
// of loads in flight. Registers (nvcc -Xptxas -v, sm_90, CUDA 13.0): 59-60 (BF16), 40 (F32),
// 32-60 for the vocabulary-parallel kernels, no spills: two 512-thread blocks an SM by
// registers as well. Per BF16 element the two passes cost two ex2 (MUFU, 16 a clock an SM),
// about 0.2 ms of MUFU time for 8 x 1024 x 50304 on an H200 against about 0.4 ms to move the
// bytes: both passes run at once in the two blocks of an SM, so memory should stay the bound.
constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte loads a thread issues before using the first
constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMaxCachedRowBytes = 110 * 1024;

// A row of n elements at p: `head` single elements up to the first 16-byte boundary, `vecs`
// aligned 16-byte accesses, `tail` single elements. `past`: elements since the 16-byte
// boundary before p (the cache copies the row at the same offset, so its vectors align too).
struct RowSplit {
  int past, head;
  int64_t vecs;
  int tail;
};
template <typename T>
__device__ RowSplit split_row(const T* p, int64_t n) {
  const int past = static_cast<int>(reinterpret_cast<uintptr_t>(p) % 16 / sizeof(T));
  const int64_t to_boundary = past == 0 ? 0 : kVec<T> - past;
  const int head = static_cast<int>(to_boundary < n ? to_boundary : n);
  const int64_t vecs = (n - head) / kVec<T>;
  return {past, head, vecs, static_cast<int>(n - head - vecs * kVec<T>)};
}

// Calls one(j, x[j]) for the single elements and vec(k, pack) for the 16-byte accesses
// (elements head + k * kVec onwards) that this thread owns: j or k = threadIdx.x mod
// blockDim.x. kUnroll loads are issued before the first is used.
template <typename T, typename One, typename Many>
__device__ void visit_row(const T* x, const RowSplit& split, One one, Many vec) {
  using P = Pack<T, kVec<T>>;
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  const int64_t tail_start = split.head + split.vecs * kVec<T>;
  if (tid < split.head) one(tid, x[tid]);  // head, tail < kVec <= blockDim.x
  if (tid < split.tail) one(tail_start + tid, x[tail_start + tid]);
  const T* body = x + split.head;
  for (int64_t k0 = tid; k0 < split.vecs; k0 += int64_t{kUnroll} * threads) {
    P buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + int64_t{u} * threads;
      if (k < split.vecs) buf[u] = load_pack<T, kVec<T>>(body + k * kVec<T>);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + int64_t{u} * threads;
      if (k < split.vecs) vec(k, buf[u]);
    }
  }
}

// The thread of visit_row that sees element j of the row.
template <typename T>
__device__ int owner_of(int64_t j, const RowSplit& split) {
  const int64_t tail_start = split.head + split.vecs * kVec<T>;
  if (j < split.head) return static_cast<int>(j);
  if (j >= tail_start) return static_cast<int>(j - tail_start);
  return static_cast<int>((j - split.head) / kVec<T> % blockDim.x);
}

// exp(x - max) as one multiply-add and a base-2 exponential; max_log2 = max * log2(e).
__device__ __forceinline__ float exp_minus(float x, float max_log2) {
  return exp2f(fmaf(x, kLog2e, -max_log2));
}

// A running max of the elements seen and the sum of exp(element - max) over them.
struct MaxSum {
  float max, sum;
};
__device__ __forceinline__ void add_one(MaxSum& s, float x) {
  if (x > s.max) {
    s.sum *= exp2f((s.max - x) * kLog2e);  // 0 while max is -inf (nothing seen)
    s.max = x;
  }
  s.sum += exp_minus(x, s.max * kLog2e);
}
template <typename T>
__device__ __forceinline__ void add_pack(MaxSum& s, const Pack<T, kVec<T>>& p) {
  float x[kVec<T>], pack_max = -INFINITY;
#pragma unroll
  for (int e = 0; e < kVec<T>; ++e) {
    x[e] = to_f32(p.v[e]);
    pack_max = fmaxf(pack_max, x[e]);
  }
  if (pack_max > s.max) {  // one rescale per pack at most
    s.sum *= exp2f((s.max - pack_max) * kLog2e);
    s.max = pack_max;
  }
  const float max_log2 = s.max * kLog2e;
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kVec<T>; ++e) sum += exp_minus(x[e], max_log2);
  s.sum += sum;
}
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float max = fmaxf(a.max, b.max);
  if (max == -INFINITY) return {max, a.sum + b.sum};  // neither has seen an element
  return {max, a.sum * exp2f((a.max - max) * kLog2e) + b.sum * exp2f((b.max - max) * kLog2e)};
}
// The block's (max, sum), in every thread: lane 0 of each warp after a butterfly, then each
// thread folds the warps' results in warp order (the same order in all of them).
__device__ MaxSum block_max_sum(MaxSum s, MaxSum* shared) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    s = combine(s, {__shfl_xor_sync(0xffffffffu, s.max, offset),
                    __shfl_xor_sync(0xffffffffu, s.sum, offset)});
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = s;
  __syncthreads();
  MaxSum total = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w) total = combine(total, shared[w]);
  return total;
}

// Writes d = softmax * dloss with softmax = exp(x - max) / sum over a row whose logits src
// has the same 16-byte alignment as d (src: the row, or its copy in shared memory), then
// subtracts dloss at the target column (local; -1 if none) in the thread that wrote it. When
// d is the row itself each thread writes only elements it has just read.
template <typename T>
__device__ void write_gradient(T* d, const T* src, const RowSplit& split, float max, float sum,
                               int64_t target, float target_logit, float dloss) {
  using P = Pack<T, kVec<T>>;
  const float factor = dloss / sum, max_log2 = max * kLog2e;
  T* body = d + split.head;
  visit_row(
      src, split,
      [&](int64_t j, T x) { d[j] = from_f32<T>(exp_minus(to_f32(x), max_log2) * factor); },
      [&](int64_t k, const P& x) {
        P g;
#pragma unroll
        for (int e = 0; e < kVec<T>; ++e)
          g.v[e] = from_f32<T>(exp_minus(to_f32(x.v[e]), max_log2) * factor);
        store_pack<T, kVec<T>>(body + k * kVec<T>, g);
      });
  if (target >= 0 && static_cast<int>(threadIdx.x) == owner_of<T>(target, split))
    d[target] = from_f32<T>(exp_minus(target_logit, max_log2) * factor - dloss);
}

// The same where d and the logits differ in alignment (a view at an odd offset): one element
// at a time, element j by thread j mod blockDim.x (d never aliases x here: an alias has its
// alignment).
template <typename T>
__device__ void write_gradient_unaligned(T* d, const T* x, int64_t V, float max, float sum,
                                         int64_t target, float target_logit, float dloss) {
  const float factor = dloss / sum, max_log2 = max * kLog2e;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    d[j] = from_f32<T>(exp_minus(to_f32(x[j]), max_log2) * factor);
  if (target >= 0 && static_cast<int64_t>(threadIdx.x) == target % blockDim.x)
    d[target] = from_f32<T>(exp_minus(target_logit, max_log2) * factor - dloss);
}

// One row per block. kCached: the row is copied into dynamic shared memory (V + kVec
// elements, at its global offset from 16 bytes) by the pass that reads it.
template <typename T, bool kCached>
__global__ void __launch_bounds__(kThreads)
    crossentropy_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                        int64_t V, float dloss, bool aligned_gradient) {
  using P = Pack<T, kVec<T>>;
  extern __shared__ uint4 cache_words[];
  __shared__ MaxSum warp_results[kThreads / kWarp];
  __shared__ float target_logit;
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  const int64_t target = targets[n];
  const bool valid = target >= 0 && target < V;
  if (threadIdx.x == 0) target_logit = valid ? to_f32(x[target]) : __int_as_float(0x7fc00000);
  const RowSplit split = split_row(x, V);
  T* cache = reinterpret_cast<T*>(cache_words) + split.past;  // cache[j] = x[j], same alignment
  P* cache_body = reinterpret_cast<P*>(cache + split.head);

  MaxSum s{-INFINITY, 0.0f};
  visit_row(
      x, split,
      [&](int64_t j, T v) {
        if constexpr (kCached) cache[j] = v;
        add_one(s, to_f32(v));
      },
      [&](int64_t k, const P& v) {
        if constexpr (kCached) cache_body[k] = v;
        add_pack<T>(s, v);
      });
  const MaxSum row = block_max_sum(s, warp_results);  // its barrier publishes target_logit
  if (losses && threadIdx.x == 0) losses[n] = row.max + logf(row.sum) - target_logit;
  if (!dlogits) return;
  T* d = dlogits + n * V;
  const T* src = kCached ? cache : x;
  if (aligned_gradient)
    write_gradient(d, src, split, row.max, row.sum, valid ? target : -1, target_logit, dloss);
  else
    write_gradient_unaligned(d, src, V, row.max, row.sum, valid ? target : -1, target_logit, dloss);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_max_kernel(float* row_max_out, const T* logits, int64_t Vl) {
  using P = Pack<T, kVec<T>>;
  __shared__ float shared[kWarp];
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * Vl;
  float m = -INFINITY;
  visit_row(
      x, split_row(x, Vl), [&](int64_t, T v) { m = fmaxf(m, to_f32(v)); },
      [&](int64_t, const P& v) {
#pragma unroll
        for (int e = 0; e < kVec<T>; ++e) m = fmaxf(m, to_f32(v.v[e]));
      });
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max_out[blockIdx.x] = m;
}

// stats[n] = sum exp(logit - row_max); stats[N + n] = the target logit if local, else 0.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_stats_kernel(float* stats, const T* logits, const float* row_maxes,
                                const int32_t* targets, int64_t N, int64_t Vl,
                                int64_t vocab_start) {
  using P = Pack<T, kVec<T>>;
  __shared__ float shared[kWarp];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * Vl;
  const float max_log2 = row_maxes[n] * kLog2e;
  float sum = 0.0f;
  visit_row(
      x, split_row(x, Vl), [&](int64_t, T v) { sum += exp_minus(to_f32(v), max_log2); },
      [&](int64_t, const P& v) {
        float pack_sum = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec<T>; ++e) pack_sum += exp_minus(to_f32(v.v[e]), max_log2);
        sum += pack_sum;
      });
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const int64_t local = targets[n] - vocab_start;
    stats[n] = sum;
    stats[N + n] = local >= 0 && local < Vl ? to_f32(x[local]) : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_finish_kernel(float* losses, T* dlogits, const T* logits, const float* row_maxes,
                                 const float* stats, const int32_t* targets, int64_t N, int64_t Vl,
                                 int64_t vocab_start, float dloss, bool aligned_gradient) {
  const int64_t n = blockIdx.x;
  const float max = row_maxes[n], sum = stats[n];
  if (losses && threadIdx.x == 0) losses[n] = max + logf(sum) - stats[N + n];
  if (!dlogits) return;
  const int64_t local = targets[n] - vocab_start;
  const int64_t target = local >= 0 && local < Vl ? local : -1;
  const T* x = logits + n * Vl;
  const RowSplit split = split_row(x, Vl);
  // dlogits may alias logits: the thread that writes the target's element reads the target
  // logit first (no other thread reads or writes it, so no barrier is needed).
  const int64_t owner = aligned_gradient ? owner_of<T>(target, split) : target % blockDim.x;
  const float target_logit = target >= 0 && threadIdx.x == owner ? to_f32(x[target]) : 0.0f;
  T* d = dlogits + n * Vl;
  if (aligned_gradient)
    write_gradient(d, x, split, max, sum, target, target_logit, dloss);
  else
    write_gradient_unaligned(d, x, Vl, max, sum, target, target_logit, dloss);
}

// Whether dlogits rows start at the same offset from 16 bytes as the logits' (both have
// rows of the same length; an alias always does).
bool same_alignment(const Tensor& dlogits, const Tensor& logits) {
  return !dlogits.data ||
         (reinterpret_cast<uintptr_t>(dlogits.data) - reinterpret_cast<uintptr_t>(logits.data)) %
                 16 ==
             0;
}

template <typename T, bool kCached>
void launch_crossentropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                         const Tensor& targets, int64_t N, int64_t V, float dloss) {
  const auto kernel = crossentropy_kernel<T, kCached>;
  size_t shared_bytes = 0;
  if constexpr (kCached) {
    shared_bytes = static_cast<size_t>(ceil_div(V + kVec<T>, kVec<T>) * 16);
    allow_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
    // All of the unified L1/shared memory as shared: two 98 KiB rows an SM.
    check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared),
          "cudaFuncSetAttribute (shared memory carveout)");
  }
  kernel<<<static_cast<unsigned>(N), kThreads, shared_bytes, stream()>>>(
      ptr<float>(losses), ptr<T>(dlogits), ptr<T>(logits), ptr<int32_t>(targets), V, dloss,
      same_alignment(dlogits, logits));
}

}  // namespace

void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                   const Tensor& logits, const Tensor& targets, int64_t N,
                                   int64_t V, float dloss) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (V * static_cast<int64_t>(sizeof(T)) <= kMaxCachedRowBytes)
      launch_crossentropy<T, true>(losses, dlogits, logits, targets, N, V, dloss);
    else
      launch_crossentropy<T, false>(losses, dlogits, logits, targets, N, V, dloss);
  });
  check_launch("crossentropy_forward_backward");
}

void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t N, int64_t Vl) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_max_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(row_max), ptr<T>(logits), Vl);
  });
  check_launch("vocab_parallel_ce_max");
}

void vocab_parallel_ce_stats(const Tensor& stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t N, int64_t Vl, int64_t vocab_start) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_stats_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(stats), ptr<T>(logits), ptr<float>(row_max), ptr<int32_t>(targets), N, Vl,
        vocab_start);
  });
  check_launch("vocab_parallel_ce_stats");
}

void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t N, int64_t Vl, int64_t vocab_start, float dloss) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_finish_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(losses), ptr<T>(dlogits), ptr<T>(logits), ptr<float>(row_max), ptr<float>(stats),
        ptr<int32_t>(targets), N, Vl, vocab_start, dloss, same_alignment(dlogits, logits));
  });
  check_launch("vocab_parallel_ce_finish");
}

}  // namespace pentad::kernels::cuda
