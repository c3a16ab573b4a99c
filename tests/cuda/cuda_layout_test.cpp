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
//            ZeRO 1, 2, 3 (3 with 2 live units and with 1); AdamW offloaded to the host over
//            ZeRO-2; recompute; MoE ep and etp;
//   4 ranks: dp x tp + sp; 2D tp (2x2); pp x dp; pp 4 stages, 1F1B and interleaved; cp x dp;
//            hybrid cp (Ulysses 2 x ring 2); MoE folding (ep 2 x etp 2 over tp 2 + sp x dp 2);
//            ZeRO-3 over dp 4; pp x dp at ZeRO-2 (zb-v) and ZeRO-3 (1F1B);
//   8 ranks: pp x dp x tp + sp; ZeRO-1 over dp 4 x tp 2; cp x tp x dp; ep 4;
//            ZeRO-2 over dp 8 with AdamW on the host.
// Checkpoints of device state over N ranks (CudaReshard, below): a layout's run saves after
// step 4 and trains on; the same layout resumed from that checkpoint trains on bitwise alike,
// and another layout of the same ranks, resharding the checkpoint as it loads, within the fp32
// bound.
// PENTAD_LAYOUT_TEST_DEVICE=cpu runs the same table on the CPU over MPI, and =cpu-staged over
// staged communicators on host tensors: the table's layouts and bounds checked on a machine
// without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/device_memory.h"
#include "parallel/comm.h"
#include "plan/layout.h"
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
// And with 8, for 4 stages of 2 virtual stages.
const ModelCase kGpt2Eight{"gpt2_8l",
                           {"model.family=gpt2", "model.n_layer=8", "model.d_model=128",
                            "model.n_head=4", "model.n_kv_head=0", "model.max_seq_len=128"},
                           128};

struct Layout {
  const char* name;  // ends in _npN: the ranks it needs
  ModelCase model;
  std::vector<std::string> keys;
  int dp = 1;     // data-parallel degree: the reference takes grad_accum = accum x dp
  int accum = 2;  // the layout's train.grad_accum (the 4-stage interleaved schedule needs 4)
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

// The steps a layout and its reference train: on the CPU (the MoE rows in the CPU suite)
// half, as the comparison and the memory plan need few and 2 cores run them.
int64_t layout_steps() {
  return test_device() == "cuda" ? kLayoutSteps : kLayoutSteps / 2;
}

// One reference per model and global batch in this process (several layouts share one):
// `micro_batches` a step.
const Trajectory& one_rank(const ModelCase& m, int micro_batches) {
  static std::map<std::string, Trajectory> done;
  const std::string key = std::string(m.name) + "/" + std::to_string(micro_batches);
  auto it = done.find(key);
  if (it == done.end())
    it = done.emplace(key, train(m, device_key(), "fp32",
                                 {"train.grad_accum=" + std::to_string(micro_batches)},
                                 /*on_mesh=*/false, layout_steps()))
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

const std::vector<std::string> kSp = {"parallel.sequence_parallel=true"};

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

TEST_P(CudaLayout, Fp32MatchesOneRank) {
  const Layout& l = GetParam();
  const Trajectory& alone = one_rank(l.model, l.accum * l.dp);
  std::vector<std::string> keys = with(l.keys, {"train.grad_accum=" + std::to_string(l.accum)});
  if (test_device() == "cpu-staged") keys.push_back("parallel.comm_backend=staged");
  const Trajectory run =
      train(l.model, device_key(), "fp32", keys, /*on_mesh=*/true, layout_steps());
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
    {"zero3_live1_np2", kGpt2, {"parallel.zero=3", "parallel.zero_live_units=1"}, 2},
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
    {"pp4_1f1b_np4", kGpt2Four, {"parallel.pp=4"}, 1},
    {"pp4_interleaved_np4",
     kGpt2Eight,
     {"parallel.pp=4", "parallel.pp_schedule=interleaved", "parallel.virtual_stages=2"},
     1,
     4},
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

// A checkpoint written on one layout and resumed on the same and on another. Both run the
// same global batch (train.global_batch = 16: grad_accum follows each layout's dp).
struct Reshard {
  const char* name;  // ends in _npN: the ranks it needs
  ModelCase model;
  std::vector<std::string> saved, resumed;  // the two layouts' keys
};

void PrintTo(const Reshard& r, std::ostream* os) {
  *os << r.name;
}

class CudaReshard : public ::testing::TestWithParam<Reshard> {
 protected:
  void SetUp() override {
    if (test_device() == "cuda" && !have_device()) GTEST_SKIP() << "no CUDA device";
    const std::string name = GetParam().name;
    if (!name.ends_with("_np" + std::to_string(world_size())))
      GTEST_SKIP() << name << " needs another rank count than " << world_size();
  }
};

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// A directory every rank of the job names alike (rank 0's process id), empty.
std::string job_directory(const std::string& what) {
  int id = ::getpid();
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("pentad-reshard-{}-{}", what, id);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

// One layout's trainer on a mesh of every rank: it trains steps [from, to) after resuming
// from `resume` (when not empty), saving after step `save_at` (when >= 0), and returns
// their losses.
std::vector<float> run_layout(const ModelCase& m, const std::vector<std::string>& layout,
                              const std::string& out, const std::string& resume, int64_t from,
                              int64_t to, int64_t save_at = -1) {
  std::vector<std::string> keys = with(layout, {"train.global_batch=16", "train.out_dir=" + out});
  if (test_device() == "cpu-staged") keys.push_back("parallel.comm_backend=staged");
  Config cfg = make_config(m, device_key(), "fp32", keys);
  const parallel::MeshConfig layout_mesh = mesh_config(cfg, world_size());
  apply_global_batch(cfg, int(layout_mesh.dp));
  const parallel::Backend backend = launch::start_rank(cfg);
  parallel::Mesh mesh = parallel::Mesh::create(layout_mesh, MPI_COMM_WORLD, backend);
  Trainer trainer(cfg, &mesh);
  if (!resume.empty()) {
    EXPECT_EQ(trainer.resume(resume), from);
  }
  std::vector<float> losses;
  for (int64_t step = from; step < to; ++step) {
    const float loss = trainer.train_step(step).loss;
    if (step >= save_at) losses.push_back(loss);
    if (step + 1 == save_at) trainer.save(save_at);  // its copy overlaps the next steps
  }
  trainer.commit_pending(true);
  return losses;
}

TEST_P(CudaReshard, ResumeIsBitwiseAndReshardsWithinTheBound) {
  const Reshard& r = GetParam();
  constexpr int64_t kSaved = 4;
  const std::string out = job_directory(r.name);
  const std::vector<float> first = run_layout(r.model, r.saved, out, "", 0, kLayoutSteps, kSaved);
  const std::string checkpoint = ckpt::checkpoint_dir(out + "/checkpoints", kSaved);
  ASSERT_TRUE(std::filesystem::exists(checkpoint)) << checkpoint;
  const std::vector<float> again =
      run_layout(r.model, r.saved, out + "/again", checkpoint, kSaved, kLayoutSteps);
  const std::vector<float> other =
      run_layout(r.model, r.resumed, out + "/other", checkpoint, kSaved, kLayoutSteps);
  ASSERT_EQ(first.size(), size_t(kLayoutSteps - kSaved));
  ASSERT_EQ(again.size(), first.size());
  ASSERT_EQ(other.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(again[i], first[i]) << r.name << ": step " << kSaved + int64_t(i)
                                  << " resumed on the same layout";
    EXPECT_LT(relative(other[i], first[i]), kFp32LossTol)
        << r.name << ": step " << kSaved + int64_t(i) << " resumed on the other layout, "
        << other[i] << " against " << first[i];
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(out);
}

const std::vector<Reshard> kReshards = {
    // 2 ranks: tp + sp to ZeRO-3; ZeRO-3 to a zero-bubble pipeline; ep to etp; cp to dp
    {"tp2_sp_to_zero3_np2", kLlama, with({"parallel.tp=2"}, kSp), {"parallel.zero=3"}},
    {"zero3_to_pp2_zb_v_np2",
     kGpt2Four,
     {"parallel.zero=3"},
     {"parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"}},
    {"ep2_to_etp2_np2", kLlamaMoe, {"parallel.ep=2"}, {"parallel.etp=2"}},
    {"cp2_ring_to_dp2_np2", kLlama, {"parallel.cp=2", "parallel.cp_impl=ring"}, {}},
    // 4 ranks: pp x dp at ZeRO-3 to dp x tp + sp
    {"pp2_dp2_zero3_to_dp2_tp2_sp_np4",
     kGpt2Four,
     {"parallel.pp=2", "parallel.zero=3"},
     with({"parallel.tp=2"}, kSp)},
};

std::string reshard_name(const ::testing::TestParamInfo<Reshard>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaReshard, ::testing::ValuesIn(kReshards), reshard_name);

}  // namespace
}  // namespace pentad
