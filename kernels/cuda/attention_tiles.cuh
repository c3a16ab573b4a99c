#pragma once
// pentad's attention kernels (attention_forward.cu, attention_backward.cu): the design they
// share, and the tile helpers both use.
//
// Causal attention with grouped-query heads, flash style: scores exist only as 32 x 32 tiles
// in shared memory, never as Tq x Tk. Forward keeps a running max and sum per query row
// (online softmax) and stores each row's log-sum-exp; backward recomputes the
// probabilities from it. All arithmetic is F32; q, k, v, out and their gradients are F32
// or BF16. Correctness first: plain F32 FMAs on CUDA cores, no tensor cores.
//
// Layout: q, out, dout, dq (B, Tq, Hq, D); k, v, dk, dv (B, Tk, Hkv, D); lse (B, Hq, Tq).
// Query head h reads kv head h / (Hq / Hkv). Scale 1/sqrt(D).
//
// Positions (context parallelism): query i sees key j iff k_pos[j] <= q_pos[i]; null
// pointers mean 0..T-1 (then Tq == Tk and this is the plain causal mask). Both ascend, so a
// query tile sees a prefix of the key tiles (up to the last row's upper bound in k_pos) and
// a key tile is seen by a suffix of the query tiles (from its first key's lower bound in
// q_pos): work follows the visible pairs. A row that sees no key gets out = 0, lse = -inf,
// and no gradient.
//
// Work split (tiling.h): 128 threads per block, tiles of 32 rows.
//  - forward: a block per (query tile, q head, batch) loops over the key tiles it sees.
//  - backward: D_i = dO_i . O_i first; then dQ with a block per (query tile, q head, batch)
//    looping over key tiles, and dK, dV with a block per (key tile, kv head, batch) looping
//    over the group's q heads and the query tiles that see it. Each block owns the rows it
//    writes (adding to them when accumulating), so there are no atomics and results are
//    bitwise reproducible.
// A thread owns 8 of the 32 x 32 score cells (a warp: one query row, 32 keys) and, of the
// 32 x D output tile, the cells idx = thread + 128 c (a warp: one row, 32 columns), held in
// registers for head_dim up to 128 and in shared memory above (Cells; tiling.h says why).
#include "kernels/cuda/common.cuh"

// Inline or templates, since both kernels' files include them; in a namespace of their own so
// that short names (kTile, dot, Cells) stay out of pentad::kernels::cuda.
namespace pentad::kernels::cuda::attention_tiles {

constexpr int kTile = kAttentionTile;
constexpr int kThreads = kAttentionThreads;
constexpr int kWarps = kThreads / kWarp;
constexpr int kScoreCells = kTile * kTile / kThreads;  // score cells per thread
constexpr int kRowsPerWarp = kTile / kWarps;           // softmax rows per warp
constexpr int kS = kTile + 1;                          // padded row stride of score tiles

// Rows [row0, row0 + 32) of head `head` of x (B, T, H, D) into dst (32 rows of `stride`
// floats); rows at or past T are zero.
template <typename E>
__device__ void load_tile(float* dst, int stride, const E* x, int64_t b, int64_t row0, int64_t head,
                          int64_t H, int64_t T, int D) {
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int i = idx / D, d = idx % D;
    const int64_t t = row0 + i;
    dst[i * stride + d] = t < T ? to_f32(x[((b * T + t) * H + head) * D + d]) : 0.0f;
  }
}

// The position of row i: pos[i], or i without positions.
__device__ __forceinline__ int64_t position(const int32_t* pos, int64_t i) {
  return pos ? static_cast<int64_t>(pos[i]) : i;
}

// The number of key tiles query rows [r0, min(r0 + 32, Tq)) see: the keys up to the last
// row's position (upper bound in k_pos) cover ceil(n / 32) tiles.
__device__ inline int64_t visible_key_tiles(const int32_t* q_pos, const int32_t* k_pos, int64_t r0,
                                            int64_t Tq, int64_t Tk) {
  const int64_t last = (r0 + kTile < Tq ? r0 + kTile : Tq) - 1;
  int64_t n = last + 1;
  if (k_pos) {
    const int32_t p = q_pos[last];
    int64_t lo = 0, hi = Tk;  // first key with k_pos > p
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (k_pos[mid] <= p)
        lo = mid + 1;
      else
        hi = mid;
    }
    n = lo;
  }
  return ((n < Tk ? n : Tk) + kTile - 1) / kTile;
}

// The output cells a thread owns: cell c is (idx / kMaxD, idx % kMaxD) for idx = thread +
// kThreads c. Registers for kMaxD up to 128; above, a (32, kMaxD) block of shared memory of
// which a thread touches only its own cells, so they need no barrier.
template <int kMaxD, bool kShared = (kMaxD > 128)>
struct Cells {
  float v[kTile * kMaxD / kThreads];
  __device__ explicit Cells(float*) {}
  __device__ __forceinline__ float& operator[](int c) { return v[c]; }
};
template <int kMaxD>
struct Cells<kMaxD, true> {
  float* v;
  __device__ explicit Cells(float* block) : v(block + threadIdx.x) {}
  __device__ __forceinline__ float& operator[](int c) { return v[c * kThreads]; }
};

// sum_d a[d] * b[d] over two shared-memory rows.
__device__ __forceinline__ float dot(const float* a, const float* b, int D) {
  float acc = 0.0f;
#pragma unroll 4
  for (int d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
}

// Output cells for head_dim up to 64, 128 (registers) or kMaxHeadDim = 256 (shared memory;
// the door in kernels/attention.cpp refuses more).
template <typename F>
void by_max_d(int64_t D, F&& f) {
  switch (attention_max_d(D)) {
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    case 128:
      f(std::integral_constant<int, 128>{});
      break;
    default:
      f(std::integral_constant<int, 256>{});
  }
}

inline size_t smem_bytes(int64_t floats) {
  return static_cast<size_t>(floats) * sizeof(float);
}

// Fails, naming the head_dim and the way out, where a kernel's shared memory is more than
// this GPU gives a block (head_dim above 128 keeps the output in shared memory: up to 201 KiB
// at 256, which sm_90's 227 KiB holds and sm_80's 163 KiB does not).
inline void require_shared_memory(const char* op, size_t bytes, int64_t D) {
  int device = 0, limit = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute (shared memory per block)");
  if (bytes > static_cast<size_t>(limit))
    fail(
        "{}: pentad's attention kernel at head_dim {} needs {} KiB of shared memory a block, "
        "more than this GPU's {} KiB: use cuDNN's (train.attention = \"auto\" or \"cudnn\", "
        "bf16) or smaller heads (raise model.n_head)",
        op, D, bytes / 1024, limit / 1024);
}

}  // namespace pentad::kernels::cuda::attention_tiles
