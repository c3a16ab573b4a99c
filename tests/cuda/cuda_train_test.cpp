// Whole training steps on the GPU against the CPU: the Trainer (src/train/trainer.h) run
// on one rank with train.device = "cuda" against the same recipe with train.device = "cpu",
// for a tiny GPT-2 (head_dim 32) and a tiny LLaMA (grouped-query attention 4:2, head_dim
// 64), 20 optimizer steps of 2 micro-batches each, from the same seed and the same data;
// and for the LLaMA with MoE layers, in fp32 and bf16.
//  - fp32 on CUDA follows fp32 on the CPU step for step (loss and step-1 gradient norm);
//  - bf16 on CUDA stays near fp32 on the CPU and learns;
//  - bf16 on CUDA is bitwise reproducible (losses, gradient norms, final master weights);
//  - a step makes the host wait for the device once (its one readback);
//  - with AdamW offloaded to the host (parallel.offload = "cpu"), fp32 and bf16 on CUDA
//    follow the CPU as closely as without it; so does fp32 with AdamW's moments on NVMe
//    (parallel.offload = "nvme", updated on the host);
//  - the host AdamW's gradients brought down ahead of the step are bitwise the CPU's step.
//
// Data: an llm.c shard the test writes itself (no corpus, no network): a Markov chain in
// which every token has 4 possible successors. It starts at ln 256 = 5.55 nats and can be
// learnt down to ln 4 = 1.39, so "the loss went down" is a real signal, unlike uniform
// random tokens, whose loss cannot fall below its starting point.
//
// Tolerances come from a PyTorch emulation of these two models and this optimizer on this
// token stream, on the CPU with float64 as the reference (pentad's CPU run of the same
// recipes falls from 5.58 to 4.64 nats (GPT-2) and to 2.84 (LLaMA) in the 20 steps):
//  - float32 drifted from float64 by at most 2e-7 of the loss over the 20 steps, and 1e-8 of
//    the step-1 gradient norm: 20 steps at lr 1e-3 are too few for rounding to grow
//    chaotically (AdamW's first steps move every weight by about lr whatever its gradient's
//    size, which is why the learning rate stays modest). The fp32 bound, 1e-4, leaves room
//    for the CUDA kernels' other summation orders and faster exp/tanh (the kernel tests bound
//    each op at 1e-5, tests/cuda/cuda_kernels_test.h); a wrong kernel moves the loss by far
//    more than 1e-4 within a step or two.
//  - rounding every weight, activation, logit and activation gradient to bf16 (8 significant
//    bits: each rounding errs by up to 2^-8 = 3.9e-3 relative) drifted by at most 1.3e-3 of
//    the loss (LLaMA, in its steepest steps; GPT-2 1.4e-4) and 2e-4 of the step-1 gradient
//    norm: a step's loss averages 1024 (GPT-2) or 2048 (LLaMA) tokens, whose rounding errors
//    of either sign mostly cancel. The bf16 bound, 1e-2, is 8 times the worst of these, for
//    roundings the emulation leaves out (bf16 attention probabilities, bf16 sums of
//    gradients); 1e-2 of the loss is still about one step's progress here, so a bf16 path
//    that stops learning or mis-scales its gradients fails.
//
// Without a CUDA device every test skips with "no CUDA device", and ctest reports it as
// skipped (tests/cuda/CMakeLists.txt); scripts/gpu_test.sh fails on a skip.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <string>
#include <system_error>
#include <vector>

#include "core/device_memory.h"
#include "launch/rank.h"
#include "optim/adamw.h"
#include "recipe/recipe.h"
#include "tests/cuda/train_test_util.h"
#include "train/trainer.h"

namespace pentad {

// How gtest prints these in failure messages.
void PrintTo(DType dtype, std::ostream* os) {
  *os << dtype_name(dtype);
}
void PrintTo(Device device, std::ostream* os) {
  *os << device_name(device);
}

namespace {

using namespace cuda_train;

class CudaTrain : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

void expect_fp32_matches_cpu(const ModelCase& m) {
  const Trajectory cpu = train(m, "cpu", "fp32");
  const Trajectory gpu = train(m, "cuda", "fp32");
  expect_losses_close(gpu, cpu, kFp32LossTol, "cuda fp32");
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kFp32GradNormTol)
      << "step-1 gradient norm: cuda fp32 " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  // The reference itself must have learnt, or the comparison says little.
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f);
}

// (a) and (d): fp32 on the GPU against fp32 on the CPU.
TEST_P(CudaTrain, Fp32MatchesCpu) {
  expect_fp32_matches_cpu(GetParam());
}

// (b) and (d): bf16 on the GPU against fp32 on the CPU; it must learn.
TEST_P(CudaTrain, Bf16TracksCpuFp32) {
  const Trajectory cpu = train(GetParam(), "cpu", "fp32");
  const Trajectory gpu = train(GetParam(), "cuda", "bf16");
  expect_losses_close(gpu, cpu, kBf16LossTol, "cuda bf16");
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kBf16GradNormTol)
      << "step-1 gradient norm: cuda bf16 " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  EXPECT_LT(gpu.losses.back(), gpu.losses.front())
      << "bf16 did not learn: first loss " << gpu.losses.front() << ", last " << gpu.losses.back();
}

// (c): the same seed twice on the GPU in bf16 gives the same bits.
TEST_P(CudaTrain, Bf16IsBitwiseReproducible) {
  const Trajectory a = train(GetParam(), "cuda", "bf16");
  const Trajectory b = train(GetParam(), "cuda", "bf16");
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)))
        << "step " << i + 1 << ": loss " << a.losses[i] << " then " << b.losses[i];
    EXPECT_EQ(0, std::memcmp(&a.grad_norms[i], &b.grad_norms[i], sizeof(double)))
        << "step " << i + 1 << ": gradient norm " << a.grad_norms[i] << " then " << b.grad_norms[i];
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t id = 0; id < a.weights.size(); ++id) {
    ASSERT_EQ(a.weights[id].size(), b.weights[id].size());
    EXPECT_EQ(0, std::memcmp(a.weights[id].data(), b.weights[id].data(),
                             a.weights[id].size() * sizeof(float)))
        << "final master weights of " << a.names[id] << " differ";
  }
}

// (e): one host wait per step. The micro-batches' losses and the squared gradient sums add
// up on the device and come back in one readback; token ids go up through page-locked
// staging (train/trainer.cpp, model/model.h). core/device_memory.h counts every CUDA call
// that makes the host wait; after two warm-up steps (cuDNN graphs, workspaces, scratch and
// staging allocated) each step waits exactly once, where before it waited for every
// micro-batch's loss, token and target upload and every parameter's gradient norm.
TEST_P(CudaTrain, OneHostWaitPerStep) {
  for (const char* precision : {"fp32", "bf16"}) {
    const Config cfg = make_config(GetParam(), "cuda", precision);
    launch::start_rank(cfg);
    Trainer trainer(cfg);
    for (int64_t step = 0; step < 2; ++step) trainer.train_step(step);
    for (int64_t step = 2; step < 6; ++step) {
      const int64_t before = device_waits();
      const StepStats s = trainer.train_step(step);
      EXPECT_EQ(device_waits() - before, 1) << precision << ", step " << step + 1;
      EXPECT_TRUE(std::isfinite(s.loss) && s.loss > 0.0f) << precision << ", step " << step + 1;
      EXPECT_GT(s.grad_norm, 0.0) << precision << ", step " << step + 1;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.name;
}

// (f): AdamW's state in host memory (optim/host_offload.h): the host's AdamW updates the
// parameters that came down and sends them back, chunk by chunk, each step. Same bounds as
// without it: on the CPU the update is the one the reference itself runs. An update that
// lost a chunk, wrote one to the wrong place or read stale gradients moves the loss within
// a step or two by far more than 1e-4.
TEST_P(CudaTrain, CpuOffloadFp32MatchesCpu) {
  const Trajectory cpu = train(GetParam(), "cpu", "fp32");
  const Trajectory gpu = train(GetParam(), "cuda", "fp32", {"parallel.offload=cpu"});
  expect_losses_close(gpu, cpu, kFp32LossTol, "cuda fp32, AdamW on the host");
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kFp32GradNormTol);
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f);
}

TEST_P(CudaTrain, CpuOffloadBf16TracksCpuFp32) {
  const Trajectory cpu = train(GetParam(), "cpu", "fp32");
  const Trajectory gpu = train(GetParam(), "cuda", "bf16", {"parallel.offload=cpu"});
  expect_losses_close(gpu, cpu, kBf16LossTol, "cuda bf16, AdamW on the host");
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

// (g): AdamW's moments on NVMe (parallel.offload = "nvme"): each sub-group of m and v read
// from the file while the previous is written back, its chunks' parameters and gradients
// streamed down, updated on the host and sent back up (optim/adamw.cpp, step_nvme_on_host).
// Sub-groups of 256 KiB (64 Ki elements a tensor) cut these models' 0.4 to 3 M values into
// many sub-groups and chunks mid-parameter. Same bounds as (f): a moment read from the wrong
// sub-group, or one not written back, moves the loss by far more within a few steps.
TEST_P(CudaTrain, NvmeOffloadFp32MatchesCpu) {
  char dir[] = "/tmp/pentad-cuda-nvme-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const Trajectory cpu = train(GetParam(), "cpu", "fp32");
  const Trajectory gpu =
      train(GetParam(), "cuda", "fp32",
            {"parallel.offload=nvme", std::string("parallel.offload_path=\"") + dir + "\"",
             "parallel.nvme_subgroup_kb=256", "parallel.nvme_block_kb=64"});
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  expect_losses_close(gpu, cpu, kFp32LossTol, "cuda fp32, AdamW state on NVMe");
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kFp32GradNormTol);
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTrain, ::testing::Values(kGpt2, kLlama), case_name);

// (h): gradients brought down during backward (optim/host_offload.h's early downloads) on
// one GPU, where no reducer exists to queue them: AdamW on the host over device parameters,
// the second half of the gradients queued for download before the step (behind the copy that
// wrote them, as the trainer queues each reduced bucket behind its reduction), the rest
// downloaded at the step, all clipped on the host. The update runs on the host in both runs
// and the copies are exact, so the parameters must be bitwise the CPU's AdamW in place on the
// same clipped gradients.
TEST(CudaHostAdamW, EarlyGradientsAreBitwiseTheCpuStep) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto make = [](Device device) {
    ParamStore p;
    p.add("matrix", Shape{300, 257}, Init::Normal, 0.02f, true);
    p.add("vector", Shape{1000}, Init::Ones, 0.0f, false);
    Placement where;
    where.device = device;
    p.allocate(where);
    p.initialize(5);
    return p;
  };
  ParamStore cpu = make(Device::CPU), gpu = make(Device::CUDA);
  const OptimConfig cfg;
  AdamW in_place(cfg, cpu), hosted(cfg, gpu, {}, nullptr, "", false, /*on_host=*/true);
  hosted.reserve_early_grads();
  const int64_t n = cpu.numel(), half = n / 2;  // the vector's chunk lies in the second half
  const size_t bytes = size_t(n) * sizeof(float);
  std::vector<float> g(static_cast<size_t>(n));
  for (int step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = 0.01f * float((i * 7 + step) % 13) - 0.06f;
    const float coefficient = 0.25f * float(step);
    copy_bytes(gpu.all_grads().data, Device::CUDA, g.data(), Device::CPU, bytes);
    hosted.forget_early_grads();
    hosted.download_early_grads(gpu.all_grads().f32(), half, n - half);
    hosted.scale_grads_on_host(coefficient);
    hosted.step(gpu, 1e-3f * float(step));
    EXPECT_EQ(hosted.early_grad_chunks(), 1u) << "the vector's chunk, not the matrix's";
    for (float& x : g) x *= coefficient;  // as the CPU's clip_gradients scales them
    std::memcpy(cpu.all_grads().data, g.data(), bytes);
    in_place.step(cpu, 1e-3f * float(step));
  }
  std::vector<float> back(static_cast<size_t>(n));
  copy_bytes(back.data(), Device::CPU, gpu.all_params().data, Device::CUDA, bytes);
  EXPECT_EQ(std::memcmp(back.data(), cpu.all_params().data, bytes), 0);
}

// MoE on the GPU: the permutation kernels and the routing's host round trips (router logits
// to the host, picks and weights back; the router's gradients the same way) follow the CPU
// step for step. A routing decision that flipped between the two would move a step's loss
// by more than the bound only if many did: each token is 1/2048 of a step's loss.
class CudaTrainMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTrainMoe, Fp32MatchesCpu) {
  expect_fp32_matches_cpu(kLlamaMoe);
}

// bf16 MoE (model/moe.h): the token rows and the experts' grouped GEMMs in bf16 from the
// experts' bf16 compute copies, the router in fp32 from its master weight and an fp32 cast of
// its input, the routing on the host in fp32. Against the CPU's fp32 run within the dense
// bf16 bounds: a routing flip moves a step's loss by little (each token is 1/2048 of it),
// while experts computing from stale compute copies, a router gradient lost in its cast
// back, or mis-typed rows would stop the run learning or move it far more than 1e-2.
TEST_F(CudaTrainMoe, Bf16TracksCpuFp32) {
  const Trajectory cpu = train(kLlamaMoe, "cpu", "fp32");
  const Trajectory gpu = train(kLlamaMoe, "cuda", "bf16");
  expect_losses_close(gpu, cpu, kBf16LossTol, "cuda bf16 MoE");
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kBf16GradNormTol)
      << "step-1 gradient norm: cuda bf16 " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.1f) << "bf16 MoE did not learn";
}

}  // namespace
}  // namespace pentad
