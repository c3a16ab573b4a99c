// The log-sum-exp merge of attention blocks (context parallelism): a rank attends its
// queries to one K/V block at a time and folds each block's (out, lse) into a running pair.
// One warp per (b, t, h) row; F32 arithmetic, out in the data type, lse in F32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

// out, block_out (B, T, H, D); lse, block_lse (B, H, T). Row r = (b * T + t) * H + h.
template <typename E>
__global__ void attention_merge_kernel(E* out, float* lse, const E* block_out,
                                       const float* block_lse, int64_t rows, int64_t T, int64_t H,
                                       int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t h = r % H, bt = r / H, t = bt % T, b = bt / T;
  const int64_t at = (b * H + h) * T + t;
  const float row_lse = lse[at], add_lse = block_lse[at];
  __syncwarp();                      // every lane has read lse before lane 0 may write it
  if (add_lse == -INFINITY) return;  // the block saw no key for this row
  E* o = out + r * D;
  const E* add = block_out + r * D;
  if (row_lse == -INFINITY) {  // nothing seen before this block
    for (int d = lane; d < D; d += kWarp) o[d] = add[d];
    if (lane == 0) lse[at] = add_lse;
    return;
  }
  const float hi = fmaxf(row_lse, add_lse), lo = fminf(row_lse, add_lse);
  const float merged = hi + log1pf(expf(lo - hi));
  const float keep = expf(row_lse - merged), take = expf(add_lse - merged);
  for (int d = lane; d < D; d += kWarp)
    o[d] = from_f32<E>(to_f32(o[d]) * keep + to_f32(add[d]) * take);
  if (lane == 0) lse[at] = merged;
}

}  // namespace

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t rows = B * T * H;
  if (rows == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    attention_merge_kernel<E>
        <<<static_cast<unsigned>(ceil_div(rows, kWarps)), kThreads, 0, stream()>>>(
            ptr<E>(out), ptr<float>(lse), ptr<E>(block_out), ptr<float>(block_lse), rows, T, H,
            static_cast<int>(D));
  });
  check_launch("attention_merge");
}

}  // namespace pentad::kernels::cuda
