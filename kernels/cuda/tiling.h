#pragma once
// Launch shapes of the CUDA kernels: plain host arithmetic, kept apart from the kernels so
// that the CPU tests check it (tests/cuda/cuda_host_test.cpp) on machines without a GPU.
#include <algorithm>
#include <cstdint>

namespace pentad::kernels::cuda {

constexpr int kWarp = 32;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over n items: enough to fill any current GPU, capped so that
// each thread does several items on large inputs. Depends only on n (and so do results).
inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, 8192));
}

// Column sums over N rows (parameter gradients of norms, bias gradients) run in two passes:
// chunks of rows each write one partial row, then the partials are added in chunk order.
// At most 1024 chunks, at least 32 rows each; fixed by N, so the sum order is too.
inline int64_t column_chunk_rows(int64_t N) {
  return std::max<int64_t>(32, ceil_div(N, 1024));
}
inline int64_t column_chunks(int64_t N) {
  return ceil_div(N, column_chunk_rows(N));
}

// Attention works on tiles of kAttentionTile query rows by kAttentionTile keys with
// kAttentionThreads threads; register tiles are sized for the head_dim rounded up to 64 or
// 128 (attention_max_d). A third size, 256, would spill registers and add a minute to every
// build, so head_dim above 128 is refused (cuda_ops.h: kMaxHeadDim).
constexpr int kAttentionTile = 32;
constexpr int kAttentionThreads = 128;

inline int attention_max_d(int64_t D) {
  return D <= 64 ? 64 : 128;
}

// Dynamic shared memory, in floats, of each attention kernel (see attention.cu for the
// layout). Rows read across lanes are padded to D + 1 floats to avoid bank conflicts.
inline int64_t attention_forward_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return t * D + t * (D + 1) + t * D  // Q, K (padded), V
         + t * (t + 1)                // scores, then probabilities
         + 3 * t;                     // running max, sum, rescale per row
}
inline int64_t attention_dq_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return 2 * t * D + 2 * t * (D + 1)  // Q, dO; K, V (padded)
         + t * (t + 1)                // dS
         + 2 * t;                     // lse, D_i per row
}
inline int64_t attention_dkdv_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return 2 * t * (D + 1) + 2 * t * D  // K, V (padded); Q, dO
         + 2 * t * (t + 1)            // P, dS
         + 2 * t;                     // lse, D_i per row
}

// Alignment in bytes of an address, capped at 256 (cuBLASLt's largest requirement).
inline int pointer_alignment(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  int alignment = 256;
  while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

}  // namespace pentad::kernels::cuda
