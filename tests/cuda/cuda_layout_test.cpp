// The parallel layouts on CUDA against one rank: under `mpirun -np N` every rank trains a
// tiny model in fp32 on its GPU alone (the reference, with grad_accum x dp micro-batches so
// that it sees the same global batch), then the same model on a mesh of the N ranks in one
// layout, and the losses must agree step by step within cuda_train_test.cpp's fp32 bound
// (1e-4), the step-1 gradient norm too. The ranks take the GPUs at their local rank modulo
// the visible count, so on a machine with one GPU all N share it, and their communicators
// are the staged backend (parallel/staged_comm.cpp: device tensors through page-locked host
// memory and MPI); with a GPU each they are NCCL. Each run checks that it got the backend
// the job should pick (a silent fallback would pass every comparison).
//
// The layouts, named for the rank count they need (ctest runs each count's with
// --gtest_filter=*npN*: tests/cuda/CMakeLists.txt, label gpu_multi):
//   2 ranks: dp; tp + sp; pp 1F1B, interleaved, zb-h1 and zb-v; cp ring and Ulysses;
//            ZeRO 1, 2, 3; AdamW offloaded to the host over ZeRO-2; recompute; MoE ep and etp;
//   4 ranks: dp x tp + sp; 2D tp (2x2); pp x dp; cp x dp; hybrid cp (Ulysses 2 x ring 2);
//            MoE folding (ep 2 x etp 2 over tp 2 + sp x dp 2); ZeRO-3 over dp 4; pp x dp
//            at ZeRO-2 (zb-v) and ZeRO-3 (1F1B);
//   8 ranks: pp x dp x tp + sp; ZeRO-1 over dp 4 x tp 2; cp x tp x dp; ep 4;
//            ZeRO-2 over dp 8 with AdamW on the host.
// Not here yet: resume bitwise and resharding from a device checkpoint over N ranks.
// PENTAD_LAYOUT_TEST_DEVICE=cpu runs the same table on the CPU over MPI, and =cpu-staged over
// staged communicators on host tensors: the table's layouts and bounds checked on a machine
// without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "parallel/comm.h"
#include "tests/cuda/train_test_util.h"

namespace pentad {
namespace {

using namespace cuda_train;

constexpr int64_t kLayoutSteps = 8;

// GPT-2 with 4 layers, so that 2 stages of 2 virtual stages each hold a layer.
const ModelCase kGpt2Four{"gpt2_4l",
                          {"model.family=gpt2", "model.n_layer=4", "model.d_model=128",
                           "model.n_head=4", "model.n_kv_head=0", "model.max_seq_len=128"},
                          128};

struct Layout {
  const char* name;  // ends in _npN: the ranks it needs
  ModelCase model;
  std::vector<std::string> keys;
  int dp = 1;  // data-parallel degree: the reference takes grad_accum = 2 dp
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.name;
}

// "cuda", or "cpu" / "cpu-staged" (PENTAD_LAYOUT_TEST_DEVICE).
std::string test_device() {
  const char* device = std::getenv("PENTAD_LAYOUT_TEST_DEVICE");
  return device ? device : "cuda";
}

std::string device_key() {
  return test_device() == "cuda" ? "cuda" : "cpu";
}

// The backend the job should have picked: NCCL with a GPU per rank (one machine), else staged.
parallel::Backend expected_backend() {
  if (test_device() == "cpu") return parallel::Backend::MPI;
  if (test_device() == "cpu-staged") return parallel::Backend::Staged;
  if (!parallel::backend_available(parallel::Backend::NCCL)) return parallel::Backend::Staged;
  return cuda_device_count() >= world_size() ? parallel::Backend::NCCL : parallel::Backend::Staged;
}

class CudaLayout : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    if (test_device() == "cuda" && !have_device()) GTEST_SKIP() << "no CUDA device";
    const std::string name = GetParam().name;
    const std::string want = "_np" + std::to_string(world_size());
    if (!name.ends_with(want))
      GTEST_SKIP() << name << " needs another rank count than " << world_size()
                   << " (run with --gtest_filter=*np" << world_size() << "*)";
  }
};

// One reference per model and global batch in this process (several layouts share one).
const Trajectory& one_rank(const ModelCase& m, int dp) {
  static std::map<std::string, Trajectory> done;
  const std::string key = std::string(m.name) + "/" + std::to_string(dp);
  auto it = done.find(key);
  if (it == done.end())
    it = done.emplace(key,
                      train(m, device_key(), "fp32", {"train.grad_accum=" + std::to_string(2 * dp)},
                            /*on_mesh=*/false, kLayoutSteps))
             .first;
  return it->second;
}

// The memory the ranks' arenas held at most (pentad's allocator counters: the device's own
// figure counts every process on it; on the CPU the host arenas') against the memory plan's
// total, which is for the rank that needs the most: within 10%. Printed either way, on a GPU
// with the workspaces and scratch.
void expect_memory_as_planned(const Trajectory& run, const std::string& name) {
  unsigned long long mine[2] = {run.memory.arena_peak_bytes, run.memory.peak_bytes}, most[2] = {};
  MPI_Allreduce(mine, most, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  const double arenas = double(most[0]), planned = run.planned_bytes;
  const std::string all =
      test_device() == "cuda"
          ? fmt::format(" (all pentad allocations {:.2f} MiB)", most[1] / 1048576.0)
          : std::string(" (host arenas)");
  std::printf("memory %s: arenas at most %.2f MiB a rank%s, plan %.2f MiB, arenas / plan %.3f\n",
              name.c_str(), arenas / 1048576.0, all.c_str(), planned / 1048576.0, arenas / planned);
  EXPECT_LT(std::abs(arenas - planned), 0.10 * planned)
      << name << ": the arenas held " << arenas << " bytes at most, the plan says " << planned;
}

TEST_P(CudaLayout, Fp32MatchesOneRank) {
  const Layout& l = GetParam();
  const Trajectory& alone = one_rank(l.model, l.dp);
  std::vector<std::string> keys = l.keys;
  if (test_device() == "cpu-staged") keys.push_back("parallel.comm_backend=staged");
  const Trajectory run = train(l.model, device_key(), "fp32", keys, /*on_mesh=*/true, kLayoutSteps);
  // The layout really ran: a mesh of every rank, with the data-parallel degree the reference's
  // global batch was sized for (a run without a mesh would match the reference as well).
  ASSERT_TRUE(run.mesh.has_value()) << l.name << ": no mesh";
  EXPECT_EQ(run.mesh->tp * run.mesh->cp * run.mesh->dp * run.mesh->pp, world_size()) << l.name;
  EXPECT_EQ(run.mesh->dp, l.dp) << l.name;
  EXPECT_EQ(run.backend, expected_backend())
      << l.name << ": communicators " << parallel::backend_name(run.backend);
  const std::string what = test_device() + " fp32 " + l.name;
  expect_losses_close(run, alone, kFp32LossTol, what);
  EXPECT_LT(relative(run.grad_norms[0], alone.grad_norms[0]), kFp32GradNormTol)
      << what << ": step-1 gradient norm " << run.grad_norms[0] << ", one rank "
      << alone.grad_norms[0];
  EXPECT_LT(alone.losses.back(), alone.losses.front() - 0.05f) << "the reference did not learn";
  expect_memory_as_planned(run, l.name);
}

const std::vector<std::string> kSp = {"parallel.sequence_parallel=true"};

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

const std::vector<Layout> kLayouts = {
    // 2 ranks
    {"dp2_np2", kGpt2, {}, 2},
    {"tp2_sp_np2", kLlama, with({"parallel.tp=2"}, kSp), 1},
    {"pp2_1f1b_np2", kGpt2Four, {"parallel.pp=2"}, 1},
    {"pp2_interleaved_np2",
     kGpt2Four,
     {"parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.virtual_stages=2"},
     1},
    {"pp2_zb_h1_np2", kGpt2Four, {"parallel.pp=2", "parallel.pp_schedule=zb-h1"}, 1},
    {"pp2_zb_v_np2",
     kGpt2Four,
     {"parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"},
     1},
    {"cp2_ring_np2", kLlama, {"parallel.cp=2", "parallel.cp_impl=ring"}, 1},
    {"cp2_ulysses_np2", kLlama, {"parallel.cp=2", "parallel.cp_impl=ulysses"}, 1},
    {"zero1_np2", kGpt2, {"parallel.zero=1"}, 2},
    {"zero2_np2", kLlama, {"parallel.zero=2"}, 2},
    {"zero3_np2", kGpt2, {"parallel.zero=3"}, 2},
    {"zero2_offload_np2", kGpt2, {"parallel.zero=2", "parallel.offload=cpu"}, 2},
    {"recompute_dp2_np2", kLlama, {"model.recompute=true"}, 2},
    {"ep2_np2", kLlamaMoe, {"parallel.ep=2"}, 2},
    {"etp2_np2", kLlamaMoe, {"parallel.etp=2"}, 2},
    // 4 ranks
    {"dp2_tp2_sp_np4", kLlama, with({"parallel.tp=2"}, kSp), 2},
    {"tp2x2_np4", kGpt2, {"parallel.tp=4", "parallel.tp_shape=2x2"}, 1},
    {"pp2_dp2_np4", kGpt2Four, {"parallel.pp=2"}, 2},
    {"cp2_dp2_np4", kLlama, {"parallel.cp=2"}, 2},
    {"cp_hybrid_np4",
     kLlama,
     {"parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"},
     1},
    {"ep2_etp2_tp2_sp_dp2_np4", kLlamaMoe,
     with({"parallel.tp=2", "parallel.ep=2", "parallel.etp=2"}, kSp), 2},
    {"zero3_dp4_np4", kGpt2, {"parallel.zero=3"}, 4},
    {"pp2_dp2_zb_v_zero2_np4",
     kGpt2Four,
     {"parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2", "parallel.zero=2"},
     2},
    {"pp2_dp2_zero3_np4", kGpt2Four, {"parallel.pp=2", "parallel.zero=3"}, 2},
    // 8 ranks
    {"pp2_dp2_tp2_sp_np8", kGpt2Four, with({"parallel.pp=2", "parallel.tp=2"}, kSp), 2},
    {"zero1_dp4_tp2_np8", kLlama, {"parallel.tp=2", "parallel.zero=1"}, 4},
    {"cp2_tp2_dp2_np8", kLlama, {"parallel.cp=2", "parallel.tp=2"}, 2},
    {"ep4_np8", kLlamaMoe, {"parallel.ep=4"}, 8},
    {"zero2_offload_dp8_np8", kGpt2, {"parallel.zero=2", "parallel.offload=cpu"}, 8},
};

std::string case_name(const ::testing::TestParamInfo<Layout>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaLayout, ::testing::ValuesIn(kLayouts), case_name);

}  // namespace
}  // namespace pentad
