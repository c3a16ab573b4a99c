// ZeRO on CUDA against the CPU, on dp ranks, with a GPU each (NCCL) or several sharing one
// (the staged communicator, parallel/staged_comm.cpp): every rank trains the recipe of
// tests/cuda/train_test_util.h on the CPU without ZeRO (the reference), then on its GPU with
//  - ZeRO-3 (parallel.zero = 3): each layer gathered through NCCL before it computes and
//    dropped after; in bf16 the gathered layer's bf16 copy re-derived from the gathered fp32
//    values (parallel/dp/grad_reducer.h). A copy left stale freezes the other ranks' shares
//    of every layer at their first values, which moves the loss by far more than the bf16
//    bound within the 20 steps;
//  - AdamW offloaded to the host (parallel.offload = "cpu", optim/host_offload.h) over
//    ZeRO-2's and ZeRO-3's compact gradient shares; at ZeRO-2 also with its moments on NVMe
//    (parallel.offload = "nvme"), and at ZeRO-3 with the parameter shares on NVMe as well
//    (fp32 and bf16).
// Bounds as in cuda_train_test.cpp: 1e-4 of the loss in fp32, 1e-2 in bf16, every step.
//
// Run with `mpirun -np N` (N >= 2; the ranks share the visible GPUs, local rank modulo the
// count). ctest registers it under the label "gpu_multi" at 2 ranks; alone, or without a GPU,
// every test skips.
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "core/device_memory.h"
#include "tests/cuda/train_test_util.h"

namespace pentad {
namespace {

using namespace cuda_train;

class CudaZero : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    if (world_size() < 2) GTEST_SKIP() << "ZeRO needs dp ranks: run under mpirun -np 2";
  }
};

// The CPU reference of a model, trained once for all the tests of this process (it took
// 5-30 s a test on the H200's host cores, every test the same run).
const Trajectory& cpu_reference(const ModelCase& m) {
  static std::map<std::string, Trajectory> done;
  auto it = done.find(m.name);
  if (it == done.end()) it = done.emplace(m.name, train(m, "cpu", "fp32")).first;
  return it->second;
}

void expect_tracks_cpu(const ModelCase& m, const std::string& precision,
                       const std::vector<std::string>& keys, const std::string& what) {
  const Trajectory& cpu = cpu_reference(m);
  const Trajectory gpu = train(m, "cuda", precision, keys);
  const bool fp32 = precision == "fp32";
  expect_losses_close(gpu, cpu, fp32 ? kFp32LossTol : kBf16LossTol, what);
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]),
            fp32 ? kFp32GradNormTol : kBf16GradNormTol)
      << what << ": step-1 gradient norm " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f) << "the reference did not learn";
}

TEST_P(CudaZero, Zero3Fp32MatchesCpu) {
  expect_tracks_cpu(GetParam(), "fp32", {"parallel.zero=3"}, "cuda fp32 ZeRO-3");
}

TEST_P(CudaZero, Zero3Bf16TracksCpuFp32) {
  expect_tracks_cpu(GetParam(), "bf16", {"parallel.zero=3"}, "cuda bf16 ZeRO-3");
}

TEST_P(CudaZero, Zero2CpuOffloadFp32MatchesCpu) {
  expect_tracks_cpu(GetParam(), "fp32", {"parallel.zero=2", "parallel.offload=cpu"},
                    "cuda fp32 ZeRO-2, AdamW on the host");
}

TEST_P(CudaZero, Zero3CpuOffloadBf16TracksCpuFp32) {
  expect_tracks_cpu(GetParam(), "bf16", {"parallel.zero=3", "parallel.offload=cpu"},
                    "cuda bf16 ZeRO-3, AdamW on the host");
}

// Trains with AdamW's state on NVMe in a directory of this rank's own, at ZeRO `zero`.
void expect_nvme_tracks_cpu(const ModelCase& m, const std::string& precision,
                            const std::string& zero, const std::string& what) {
  char dir[] = "/tmp/pentad-cuda-zero-nvme-XXXXXX";  // one per rank
  ASSERT_NE(::mkdtemp(dir), nullptr);
  expect_tracks_cpu(m, precision,
                    {"parallel.zero=" + zero, "parallel.offload=nvme",
                     std::string("parallel.offload_path=\"") + dir + "\"",
                     "parallel.nvme_subgroup_kb=256", "parallel.nvme_block_kb=64"},
                    what);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// AdamW's moments of the compact ZeRO-2 shares on NVMe (a file per rank), updated on the host.
TEST_P(CudaZero, Zero2NvmeOffloadFp32MatchesCpu) {
  expect_nvme_tracks_cpu(GetParam(), "fp32", "2", "cuda fp32 ZeRO-2, AdamW state on NVMe");
}

// ZeRO-3 with the parameter shares on NVMe too (parallel.offload_params, the default;
// ZeRO-Infinity): before each unit's all-gather its share is read from the file into
// page-locked staging and copied into the arena on the compute stream; the host's AdamW
// updates the file's values from the downloaded gradient shares, and nothing goes back to
// the device. A share uploaded after its gather started, to the wrong place, or not at all
// (the arena's share is zeros after a release) moves the loss by far more than 1e-4 at once;
// an update that did not reach the file freezes the shares at their first values.
TEST_P(CudaZero, Zero3NvmeParameterSharesFp32MatchesCpu) {
  expect_nvme_tracks_cpu(GetParam(), "fp32", "3",
                         "cuda fp32 ZeRO-3, parameter shares and AdamW state on NVMe");
}

// The same in bf16: the unit's bf16 copy must be re-derived after the fetch and the gather
// (GradReducer::refresh_compute_copy); a stale copy keeps every unit at its first values.
TEST_P(CudaZero, Zero3NvmeParameterSharesBf16TracksCpuFp32) {
  expect_nvme_tracks_cpu(GetParam(), "bf16", "3",
                         "cuda bf16 ZeRO-3, parameter shares and AdamW state on NVMe");
}

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Models, CudaZero, ::testing::Values(kGpt2, kLlama), case_name);

}  // namespace
}  // namespace pentad
