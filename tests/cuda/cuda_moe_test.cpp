// MoE across ranks against the CPU, on two ranks with a GPU each (NCCL) or sharing one (the
// staged communicator): every rank trains the same MoE recipe and layout on the CPU (MPI,
// the reference) and on its GPU, and the two must agree step for step in fp32 within
// cuda_train_test.cpp's bound (1e-4 of the loss, every step; 1e-4 of the step-1 gradient
// norm). The layouts, each on both tiny MoE models (LLaMA: softmax, renormalised, aux loss;
// GPT-2: sigmoid, a shared expert, biased experts, aux-loss-free bias updates):
//  - dp 2: every expert on both ranks; the experts' gradients summed over edp = 2 by their
//    own reducer, on the device;
//  - ep 2: two experts per rank; the counts exchanged over MPI, then the token rows
//    dispatched and combined by NCCL's uneven all-to-all (parallel/ep/expert_parallel.h);
//  - etp 2: every expert's width split over both ranks; the rows all-gathered and the
//    partial outputs reduce-scattered over etp (GPT-2's replicated output bias added once);
//  - ep 2 with moe.capacity_factor = 1: dropped picks decided over the whole micro-batch.
// A layout that silently fell back to whole experts on every rank would train the same
// losses (the layouts are equivalent by design), so each run also checks the experts it
// holds: which ones (ep) and how wide (etp).
// bf16 (CudaMoeBf16): the LLaMA MoE in bf16 with ep 2 and with etp 2, whose exchange moves
// bf16 rows (2 bytes an element) and reduce-scatters bf16 partial outputs in bf16, against
// the CPU's fp32 run of the same layout within the dense bf16 bounds (cuda_train_test's
// CudaTrainMoe.Bf16TracksCpuFp32 is the same check with every expert on one GPU).
//
// Run with `mpirun -np 2` (or more, the layouts adapting dp; ranks may share a GPU). ctest
// registers it under the label "gpu_multi" with cuda_zero_test; alone, or without a GPU,
// every test skips.
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "model/moe.h"
#include "tests/cuda/train_test_util.h"

namespace pentad {
namespace {

using namespace cuda_train;

// GPT-2 with every MLP routed: 4 experts of width 128 (with biases), top 2 by sigmoid, not
// renormalised, one shared expert, steered by the aux-loss-free bias.
const ModelCase kGpt2Moe{
    "gpt2_moe",
    {"model.family=gpt2", "model.n_layer=3", "model.d_model=128", "model.n_head=4",
     "model.n_kv_head=0", "model.max_seq_len=128", "model.moe_layers=all", "model.n_experts=4",
     "model.top_k=2", "model.d_ff_expert=128", "model.n_shared_experts=1", "moe.score=sigmoid",
     "moe.renormalize=false", "moe.bias_update_rate=1e-3"},
    128};

struct Layout {
  const char* name;
  std::vector<std::string> keys;
  int ep = 1, etp = 1;
};

struct MoeCase {
  ModelCase model;
  Layout layout;
};

void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << c.model.name << "_" << c.layout.name;
}

class CudaMoe : public ::testing::TestWithParam<MoeCase> {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    if (world_size() < 2) GTEST_SKIP() << "expert parallelism needs ranks: mpirun -np 2";
  }
};

// The routed experts this rank holds (by name) and the width of their up projections.
void expect_experts_split(const Trajectory& run, const MoeCase& c) {
  const ModelConfig& m = make_config(c.model, "cpu", "fp32").model;
  const int64_t width = expert_ffn_dim(m) / c.layout.etp;
  std::set<std::string> experts;
  for (size_t i = 0; i < run.names.size(); ++i) {
    const std::string& name = run.names[i];
    const size_t at = name.find(".experts.");
    if (name.rfind("layers.0.", 0) != 0 || at == std::string::npos) continue;
    experts.insert(name.substr(at + 9, name.find('.', at + 9) - at - 9));
    if (name.ends_with(".up.weight")) {
      EXPECT_EQ(int64_t(run.weights[i].size()), width * m.d_model) << name;
    }
  }
  EXPECT_EQ(int64_t(experts.size()), m.n_experts / c.layout.ep)
      << c.layout.name << ": layer 0 holds the wrong number of routed experts";
}

// The CPU's fp32 run of a model on a layout, once per process (the fp32 and bf16 tests of
// a layout compare against the same).
const Trajectory& cpu_reference(const MoeCase& c) {
  static std::map<std::string, Trajectory> done;
  const std::string key = std::string(c.model.name) + "/" + c.layout.name;
  auto it = done.find(key);
  if (it == done.end()) it = done.emplace(key, train(c.model, "cpu", "fp32", c.layout.keys)).first;
  return it->second;
}

TEST_P(CudaMoe, Fp32MatchesCpu) {
  const MoeCase& c = GetParam();
  const std::string what = std::string("cuda fp32 ") + c.layout.name;
  const Trajectory& cpu = cpu_reference(c);
  const Trajectory gpu = train(c.model, "cuda", "fp32", c.layout.keys);
  expect_experts_split(gpu, c);
  expect_losses_close(gpu, cpu, kFp32LossTol, what);
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kFp32GradNormTol)
      << what << ": step-1 gradient norm " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f) << "the reference did not learn";
}

const Layout kDp{"dp2", {}};
const Layout kEp{"ep2", {"parallel.ep=2"}, 2, 1};
const Layout kEtp{"etp2", {"parallel.etp=2"}, 1, 2};
const Layout kEpCapacity{"ep2_capacity", {"parallel.ep=2", "moe.capacity_factor=1.0"}, 2, 1};

// bf16 MoE with its experts split: rows mis-sized in the exchange (4 bytes read as 2, or
// offsets in f32 elements) scramble tokens across experts and stop the run learning, or
// move its losses far more than the 1e-2 a routing flip or bf16 rounding does.
class CudaMoeBf16 : public CudaMoe {};

TEST_P(CudaMoeBf16, Bf16TracksCpuFp32) {
  const MoeCase& c = GetParam();
  const std::string what = std::string("cuda bf16 ") + c.layout.name;
  const Trajectory& cpu = cpu_reference(c);
  const Trajectory gpu = train(c.model, "cuda", "bf16", c.layout.keys);
  expect_experts_split(gpu, c);
  expect_losses_close(gpu, cpu, kBf16LossTol, what);
  EXPECT_LT(relative(gpu.grad_norms[0], cpu.grad_norms[0]), kBf16GradNormTol)
      << what << ": step-1 gradient norm " << gpu.grad_norms[0] << ", CPU fp32 "
      << cpu.grad_norms[0];
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.1f) << what << ": did not learn";
}

std::string case_name(const ::testing::TestParamInfo<MoeCase>& info) {
  return std::string(info.param.model.name) + "_" + info.param.layout.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaMoe,
                         ::testing::Values(MoeCase{kLlamaMoe, kDp}, MoeCase{kLlamaMoe, kEp},
                                           MoeCase{kLlamaMoe, kEtp},
                                           MoeCase{kLlamaMoe, kEpCapacity}, MoeCase{kGpt2Moe, kDp},
                                           MoeCase{kGpt2Moe, kEp}, MoeCase{kGpt2Moe, kEtp}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Layouts, CudaMoeBf16,
                         ::testing::Values(MoeCase{kLlamaMoe, kEp}, MoeCase{kLlamaMoe, kEtp}),
                         case_name);

}  // namespace
}  // namespace pentad
