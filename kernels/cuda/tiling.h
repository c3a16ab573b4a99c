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

// The norms' backward (norms.cu: norm_backward_rows_kernel): a group of group_threads
// threads (32 to 512, a power of two) per row, each thread holding up to kNormBackwardVecs
// accesses of `width` elements of a row in registers; blocks of `threads` (at least 256:
// several rows per block when a group is narrower) run `rounds` rounds of threads /
// group_threads consecutive rows each and write one partial row of column sums. At most
// kNormBackwardMaxBlocks blocks, so those partials stay a few per cent of the traffic
// (256 x 2C F32 against GPT-2's 8192 x C x 8 bytes), and two blocks an SM of 132 (an H200)
// hold the whole grid at once. Fixed by N, C and width, so the order of every sum is too.
// blocks == 0: rows too wide (more than 512 x 3 accesses): the caller takes another path.
constexpr int kNormBackwardVecs = 3;
constexpr int kNormBackwardMaxThreads = 512;
constexpr int64_t kNormBackwardMaxBlocks = 256;

struct NormBackwardShape {
  int group_threads = 0, threads = 0;
  int64_t rounds = 0, blocks = 0;
};

inline NormBackwardShape norm_backward_shape(int64_t N, int64_t C, int width) {
  const int64_t accesses = ceil_div(C, width);
  NormBackwardShape s;
  s.group_threads = kWarp;
  while (s.group_threads * int64_t{kNormBackwardVecs} < accesses &&
         s.group_threads < kNormBackwardMaxThreads)
    s.group_threads *= 2;
  if (s.group_threads * int64_t{kNormBackwardVecs} < accesses || N == 0) return {};
  s.threads = std::max(s.group_threads, 256);
  const int64_t block_rounds = ceil_div(N, s.threads / s.group_threads);  // rows a group takes
  s.rounds = ceil_div(block_rounds, kNormBackwardMaxBlocks);
  s.blocks = ceil_div(block_rounds, s.rounds);
  return s;
}

// Attention works on tiles of kAttentionTile query rows by kAttentionTile keys with
// kAttentionThreads threads. Each thread owns kAttentionTile * max_d / kAttentionThreads cells
// of the (tile, head_dim) output, sized for the head_dim rounded up to 64, 128 or 256
// (attention_max_d). Up to 128 those cells are registers; at 256 they would be 64 (dk and dv:
// 128) registers a thread on top of the 160-odd the 128 variant already takes, and would spill,
// so the 256 variant keeps them in shared memory instead (attention_cells_in_shared), a
// thread's own cells at stride kAttentionThreads: no bank conflicts, no barriers.
constexpr int kAttentionTile = 32;
constexpr int kAttentionThreads = 128;

inline int attention_max_d(int64_t D) {
  return D <= 64 ? 64 : D <= 128 ? 128 : 256;
}

inline bool attention_cells_in_shared(int64_t D) {
  return attention_max_d(D) > 128;
}

// Floats of one (tile, max_d) block of output cells in shared memory (0 where they are
// registers).
inline int64_t attention_shared_cells_floats(int64_t D) {
  return attention_cells_in_shared(D) ? int64_t{kAttentionTile} * attention_max_d(D) : 0;
}

// Dynamic shared memory, in floats, of each attention kernel (see attention_forward.cu and
// attention_backward.cu for the layout). Rows read across lanes are padded to D + 1 floats
// to avoid bank conflicts; the output cells, where shared, come last (the forward's o, dq's
// accumulator, dk's and dv's).
inline int64_t attention_forward_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return t * D + t * (D + 1) + t * D  // Q, K (padded), V
         + t * (t + 1)                // scores, then probabilities
         + 3 * t                      // running max, sum, rescale per row
         + attention_shared_cells_floats(D);
}
inline int64_t attention_dq_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return 2 * t * D + 2 * t * (D + 1)  // Q, dO; K, V (padded)
         + t * (t + 1)                // dS
         + 2 * t                      // lse, D_i per row
         + attention_shared_cells_floats(D);
}
inline int64_t attention_dkdv_smem_floats(int64_t D) {
  const int64_t t = kAttentionTile;
  return 2 * t * (D + 1) + 2 * t * D  // K, V (padded); Q, dO
         + 2 * t * (t + 1)            // P, dS
         + 2 * t                      // lse, D_i per row
         + 2 * attention_shared_cells_floats(D);
}

// Alignment in bytes of an address, capped at 256 (cuBLASLt's largest requirement).
inline int pointer_alignment(const void* ptr) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  int alignment = 256;
  while (alignment > 1 && address % static_cast<uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

}  // namespace pentad::kernels::cuda
