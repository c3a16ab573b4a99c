// The host-side arithmetic of the CUDA kernels (kernels/cuda/tiling.h), which runs on any
// machine: launch shapes cover their inputs, reduction chunking is fixed by the shape, and
// the attention kernels' shared memory fits the devices pentad builds for (sm_80 up to
// head_dim 128, sm_90 up to 256); and cuBLASLt, which pentad opens at the first GEMM instead of
// linking, opens.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "core/device_memory.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/tiling.h"

namespace pentad::kernels::cuda {
namespace {

TEST(CublasLt, OpensAtFirstUseAndIsTheVersionCompiledFor) {
  // Opened and its functions found by name, no device needed: the major version is the one
  // the headers were (CUBLASLT_VERSION: major * 10000 + minor * 100 + patch).
  EXPECT_EQ(cublaslt_version() / 10000, size_t{CUBLAS_VER_MAJOR});
}

TEST(CudaTiling, GridsCoverEveryItemWithinTheLimit) {
  for (int64_t n :
       {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{1} << 20, int64_t{1} << 33}) {
    const unsigned blocks = grid_for(n, 256);
    EXPECT_GE(blocks, 1u);
    EXPECT_LE(blocks, 8192u);
    // A grid-stride loop covers n with any positive grid; no block is wholly idle.
    EXPECT_LE((static_cast<int64_t>(blocks) - 1) * 256, n - 1) << n;
  }
  EXPECT_EQ(grid_for(0, 256), 1u);
}

TEST(CudaTiling, ColumnChunksCoverTheRowsOnce) {
  for (int64_t N : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{1000},
                    int64_t{32768}, int64_t{32769}, int64_t{1} << 24}) {
    const int64_t rows = column_chunk_rows(N), chunks = column_chunks(N);
    EXPECT_GE(rows, 32);
    EXPECT_LE(chunks, 1024) << N;
    EXPECT_GE(chunks * rows, N) << N;
    EXPECT_LT((chunks - 1) * rows, N) << N;  // no empty chunk
  }
}

TEST(CudaTiling, AttentionRegisterTilesAndSharedMemoryFit) {
  EXPECT_EQ(kMaxHeadDim, 256);
  for (int64_t D = 1; D <= kMaxHeadDim; ++D) {
    const int max_d = attention_max_d(D);
    EXPECT_GE(max_d, D);
    EXPECT_LT(max_d / 2, std::max<int64_t>(D, 33));  // the smallest of 64, 128, 256 that holds D
    // Output cells split evenly over the threads, a warp's cells in one row.
    EXPECT_EQ(kAttentionTile * max_d % kAttentionThreads, 0);
    EXPECT_EQ(max_d % kWarp, 0);
    // Cells in registers up to 128, in shared memory above.
    EXPECT_EQ(attention_cells_in_shared(D), D > 128) << D;
    // Opt-in shared memory per block: 163 KiB on sm_80 (head_dim up to 128 runs there too),
    // 227 KiB on sm_90 (up to 256).
    const int64_t limit = (D <= 128 ? 163 : 227) * 1024;
    for (int64_t floats : {attention_forward_smem_floats(D), attention_dq_smem_floats(D),
                           attention_dkdv_smem_floats(D)})
      EXPECT_LE(floats * 4, limit) << "head_dim " << D;
  }
  EXPECT_EQ(attention_max_d(64), 64);
  EXPECT_EQ(attention_max_d(65), 128);
  EXPECT_EQ(attention_max_d(128), 128);
  EXPECT_EQ(attention_max_d(129), 256);
  EXPECT_EQ(attention_max_d(256), 256);
  // The largest: dk and dv's cells beside K, V, Q, dO, P and dS at head_dim 256.
  EXPECT_EQ(attention_dkdv_smem_floats(256) * 4, 205568);
  EXPECT_EQ(kAttentionTile * kAttentionTile % kAttentionThreads, 0);
  EXPECT_EQ(kAttentionTile % (kAttentionThreads / kWarp), 0);  // softmax rows per warp
}

TEST(CudaTiling, PointerAlignment) {
  alignas(256) static char buffer[512];
  EXPECT_EQ(pointer_alignment(buffer), 256);
  EXPECT_EQ(pointer_alignment(buffer + 2), 2);
  EXPECT_EQ(pointer_alignment(buffer + 64), 64);
  EXPECT_EQ(pointer_alignment(buffer + 3), 1);
  EXPECT_EQ(pointer_alignment(nullptr), 256);
}

TEST(CudaDevice, CountingDevicesNeverThrows) {
  EXPECT_GE(cuda_device_count(), 0);
}

}  // namespace
}  // namespace pentad::kernels::cuda
