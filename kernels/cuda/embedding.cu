// Token (+ position) embedding. The backward pass is deterministic without floating-point
// atomics: token positions are grouped by vocabulary row (a counting sort), each group is
// put in position order, and one block per row adds its gradient rows in that order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;

// out (B*T, C) = wte[token - vocab_start] (+ wpe[p(t)], p(t) = positions[t] or t). Rows
// outside the shard are zero, or NaN when the table is whole (strict: the token is out of
// range).
template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         const int32_t* positions, int64_t BT, int64_t T_,
                                         int64_t C, int64_t V, int64_t vocab_start, bool strict) {
  const int64_t n = BT * C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_start;
    float v = 0.0f;
    if (row >= 0 && row < V)
      v = to_f32(wte[row * C + c]);
    else if (strict)
      v = __int_as_float(0x7fc00000);  // NaN
    if (wpe) {
      const int64_t t = bt % T_;
      v += to_f32(wpe[(positions ? static_cast<int64_t>(positions[t]) : t) * C + c]);
    }
    out[i] = from_f32<T>(v);
  }
}

// counts[row] = number of positions holding that row (integer atomics: exact).
__global__ void count_rows_kernel(int32_t* counts, const int32_t* tokens, int64_t BT, int64_t V,
                                  int64_t vocab_start) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < BT;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = static_cast<int64_t>(tokens[p]) - vocab_start;
    if (row >= 0 && row < V) atomicAdd(&counts[row], 1);
  }
}

// offsets[v] = sum of counts[0, v) for v in [0, V]; cursor = a copy of offsets[0, V). One
// block walks the rows in chunks of kScanThreads, carrying the running total.
__global__ void exclusive_scan_kernel(int32_t* offsets, int32_t* cursor, const int32_t* counts,
                                      int64_t V) {
  __shared__ int32_t values[kScanThreads];
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  for (int64_t base = 0; base < V; base += kScanThreads) {
    const int64_t v = base + threadIdx.x;
    const int32_t count = v < V ? counts[v] : 0;
    values[threadIdx.x] = count;
    __syncthreads();
    // Hillis-Steele inclusive scan over the chunk.
    for (int offset = 1; offset < kScanThreads; offset *= 2) {
      const int32_t add = threadIdx.x >= offset ? values[threadIdx.x - offset] : 0;
      __syncthreads();
      values[threadIdx.x] += add;
      __syncthreads();
    }
    const int32_t exclusive = carry + values[threadIdx.x] - count;
    if (v < V) {
      offsets[v] = exclusive;
      cursor[v] = exclusive;
    }
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == kScanThreads - 1) carry += values[threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[V] = carry;
}

// Puts each position in its row's group; the order inside a group depends on timing and is
// fixed by the next kernel.
__global__ void scatter_positions_kernel(int32_t* grouped, int32_t* cursor, const int32_t* tokens,
                                         int64_t BT, int64_t V, int64_t vocab_start) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < BT;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = static_cast<int64_t>(tokens[p]) - vocab_start;
    if (row >= 0 && row < V) grouped[atomicAdd(&cursor[row], 1)] = static_cast<int32_t>(p);
  }
}

// One block per vocabulary row: sorts its positions (rank = how many are smaller; positions
// are distinct) into `sorted`, then adds dout rows in position order into dwte, starting
// from dwte's value as the CPU kernel does. O(k^2 / threads) for a row seen k times.
template <typename T>
__global__ void accumulate_rows_kernel(float* dwte, const T* dout, const int32_t* offsets,
                                       const int32_t* grouped, int32_t* sorted, int64_t C) {
  const int64_t row = blockIdx.x;
  const int32_t begin = offsets[row], count = offsets[row + 1] - begin;
  if (count == 0) return;
  for (int32_t i = threadIdx.x; i < count; i += blockDim.x) {
    const int32_t p = grouped[begin + i];
    int32_t rank = 0;
    for (int32_t j = 0; j < count; ++j) rank += grouped[begin + j] < p;
    sorted[begin + rank] = p;
  }
  __syncthreads();  // the block's global writes to `sorted` are visible to the block
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dwte[row * C + c];
    for (int32_t i = 0; i < count; ++i) acc += to_f32(dout[sorted[begin + i] * C + c]);
    dwte[row * C + c] = acc;
  }
}

// dwpe[t] += dout[b, t] over b in order. With positions, dwpe[positions[t]]: the thread of
// the first t of a run of equal positions (they ascend, so repeats are adjacent) adds the
// whole run, t by t and b by b, the CPU kernel's order; no two threads share a row.
template <typename T>
__global__ void position_grad_kernel(float* dwpe, const T* dout, const int32_t* positions,
                                     int64_t B, int64_t T_, int64_t C) {
  const int64_t n = T_ * C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!positions) {
      float acc = dwpe[i];
      for (int64_t b = 0; b < B; ++b) acc += to_f32(dout[b * n + i]);
      dwpe[i] = acc;
      continue;
    }
    const int64_t t = i / C, c = i % C;
    const int32_t p = positions[t];
    if (t > 0 && positions[t - 1] == p) continue;  // the run's first thread adds it
    float& row = dwpe[static_cast<int64_t>(p) * C + c];
    float acc = row;
    for (int64_t u = t; u < T_ && positions[u] == p; ++u)
      for (int64_t b = 0; b < B; ++b) acc += to_f32(dout[b * n + u * C + c]);
    row = acc;
  }
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, const Tensor& positions, int64_t B, int64_t T, int64_t C,
                       int64_t V, int64_t vocab_start) {
  const int64_t n = B * T * C;
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    embedding_forward_kernel<E><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<E>(out), ptr<int32_t>(tokens), ptr<E>(wte), ptr<E>(wpe), ptr<int32_t>(positions), B * T,
        T, C, V, vocab_start < 0 ? 0 : vocab_start, vocab_start < 0);
  });
  check_launch("embedding_forward");
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, const Tensor& positions, int64_t B, int64_t T,
                        int64_t C, int64_t V, int64_t vocab_start) {
  const int64_t BT = B * T;
  if (BT == 0 || C == 0) return;
  by_dtype(dout.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    if (dwte.data && V > 0) {
      const int64_t start = vocab_start < 0 ? 0 : vocab_start;
      // Scratch: counts (V), offsets (V + 1), cursor (V), grouped (BT), sorted (BT).
      int32_t* counts = static_cast<int32_t*>(scratch((3 * V + 1 + 2 * BT) * sizeof(int32_t)));
      int32_t* offsets = counts + V;
      int32_t* cursor = offsets + V + 1;
      int32_t* grouped = cursor + V;
      int32_t* sorted = grouped + BT;
      check(cudaMemsetAsync(counts, 0, V * sizeof(int32_t), stream()), "cudaMemsetAsync");
      const int32_t* tok = ptr<int32_t>(tokens);
      count_rows_kernel<<<grid_for(BT, kThreads), kThreads, 0, stream()>>>(counts, tok, BT, V,
                                                                           start);
      check_launch("embedding_backward (count)");
      exclusive_scan_kernel<<<1, kScanThreads, 0, stream()>>>(offsets, cursor, counts, V);
      check_launch("embedding_backward (scan)");
      scatter_positions_kernel<<<grid_for(BT, kThreads), kThreads, 0, stream()>>>(
          grouped, cursor, tok, BT, V, start);
      check_launch("embedding_backward (scatter)");
      accumulate_rows_kernel<E><<<static_cast<unsigned>(V), kThreads, 0, stream()>>>(
          ptr<float>(dwte), ptr<E>(dout), offsets, grouped, sorted, C);
      check_launch("embedding_backward (rows)");
    }
    if (dwpe.data) {
      position_grad_kernel<E><<<grid_for(T * C, kThreads), kThreads, 0, stream()>>>(
          ptr<float>(dwpe), ptr<E>(dout), ptr<int32_t>(positions), B, T, C);
      check_launch("embedding_backward (positions)");
    }
  });
}

}  // namespace pentad::kernels::cuda
