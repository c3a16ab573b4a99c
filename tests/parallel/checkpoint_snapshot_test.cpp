// In-job restart from host memory (dp2 x tp2 with sequence parallelism; pp2 x dp2; MoE at
// ZeRO-2 and ZeRO-3), with both kinds of snapshot. Copy: only the first data-parallel replica
// stages a snapshot, and only tp rank 0 stages replicated parameters; restore_snapshot() broadcasts
// the rest.
// Swap: every rank goes back to its own frozen set. Every rank must end bitwise where a resume from
// the step's checkpoint on disk puts it, parameters and AdamW moments, and train on identically.
// Compared on every rank, moments included: a rank whose copy of a replicated parameter
// the forward never reads (the GPT-2 experts' output bias beyond the first etp rank) shows
// wrong moments in no loss, and only three steps later in its parameters.
// Run alone, rank 0's gtest report speaks for rank 0 only: the verdict is the exit status
// and the "failed on rank(s)" line (mpi_test_main.cpp).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "launch/rank.h"
#include "parallel/mesh.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

using namespace pentad;

namespace {

// This rank's master parameters, then its AdamW m and v (of its shares, with ZeRO).
std::vector<float> state_of(Trainer& t) {
  const ParamStore& p = t.model().params();
  const float* const values = p.all_params().f32();
  std::vector<float> state;
  if (p.sparse_params())  // ZeRO-3: the arena holds this rank's shares, nothing else
    for (const StateShard::Range& r : t.optimizer().shard().ranges)
      state.insert(state.end(), values + r.begin, values + r.end);
  else
    state.assign(values, values + p.numel());
  const size_t moments = size_t(t.optimizer().shard().numel);
  for (void* base : {t.optimizer().m_base(), t.optimizer().v_base()}) {
    const float* at = static_cast<const float*>(base);
    state.insert(state.end(), at, at + moments);
  }
  return state;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

static void check_restore(const std::string& name, std::vector<std::string> keys) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // one directory for every rank
  const std::filesystem::path out = std::filesystem::temp_directory_path() /
                                    ("pentad-snapshot-" + name + "-" + std::to_string(pid));
  keys.push_back("train.out_dir=" + out.string());
  const Config cfg = parse_recipe("", "snapshot-test", keys);
  launch::start_rank(cfg);  // threads and device, as the executable sets them
  parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, world), MPI_COMM_WORLD);
  constexpr int64_t kSaved = 5, kEnd = 8;
  std::vector<float> first, again, resumed, restored_state, final_state;
  {
    Trainer trainer(cfg, &mesh);
    for (int64_t s = 0; s < kSaved; ++s) trainer.train_step(s);
    trainer.save(kSaved);
    for (int64_t s = kSaved; s < kEnd; ++s) first.push_back(trainer.train_step(s).loss);
    trainer.commit_pending(true);
    ASSERT_EQ(trainer.restore_snapshot(), kSaved);
    restored_state = state_of(trainer);
    for (int64_t s = kSaved; s < kEnd; ++s) again.push_back(trainer.train_step(s).loss);
    final_state = state_of(trainer);
  }
  Trainer from_disk(cfg, &mesh);
  ASSERT_EQ(from_disk.resume(ckpt::checkpoint_dir(from_disk.checkpoint_root(), kSaved)), kSaved);
  EXPECT_TRUE(same_bits(state_of(from_disk), restored_state)) << "restored: parameters and moments";
  for (int64_t s = kSaved; s < kEnd; ++s) resumed.push_back(from_disk.train_step(s).loss);
  EXPECT_TRUE(same_bits(again, first));
  EXPECT_TRUE(same_bits(resumed, first));
  EXPECT_TRUE(same_bits(state_of(from_disk), final_state)) << "after the steps again";
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !::testing::Test::HasFailure()) std::filesystem::remove_all(out);
}

// Both kinds of snapshot: swap (every rank swaps back to its own frozen set) and copy
// (staged by the first replica, broadcast to the others).
class CheckpointSnapshot : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDiskOnDp2Tp2) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  check_restore(
      std::string("dp2tp2-") + GetParam(),
      {std::string("checkpoint.snapshot=") + GetParam(), "model.family=llama", "model.n_layer=2",
       "model.d_model=64", "model.n_head=4", "model.n_kv_head=2", "model.vocab_size=512",
       "model.tie_embeddings=false", "train.seq_len=32", "train.micro_batch=2",
       "train.grad_accum=2", "train.steps=10", "train.threads=1", "train.eval_every=0",
       "data.source=random", "parallel.tp=2", "parallel.sequence_parallel=true"});
}

// ZeRO-3 over dp4: every rank stages its shares of the parameters, and the restore leaves
// nothing else of them in memory (a unit whole at the save, swapped back, would be).
TEST_P(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDiskOnDp4Zero3) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  check_restore(std::string("dp4zero3-") + GetParam(),
                {std::string("checkpoint.snapshot=") + GetParam(), "model.family=llama",
                 "model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.n_kv_head=2",
                 "model.vocab_size=512", "train.seq_len=32", "train.micro_batch=2",
                 "train.grad_accum=2", "train.steps=10", "train.threads=1", "train.eval_every=0",
                 "data.source=random", "parallel.tp=1", "parallel.zero=3"});
}

// Pipeline: the last stage's copy of the tied embedding is not staged; it comes from the
// first stage.
TEST_P(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDiskOnPp2Dp2) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  check_restore(std::string("pp2dp2-") + GetParam(),
                {std::string("checkpoint.snapshot=") + GetParam(), "model.family=gpt2",
                 "model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.vocab_size=512",
                 "model.tie_embeddings=true", "train.seq_len=32", "train.micro_batch=2",
                 "train.grad_accum=2", "train.steps=10", "train.threads=1", "train.eval_every=0",
                 "data.source=random", "parallel.pp=2", "parallel.tp=1"});
}

// The MoE cases' recipe: GPT-2 experts split over etp 2 (edp 2) on 4 ranks, at ZeRO `zero`.
static std::vector<std::string> moe_etp2_keys(const std::string& snapshot, int zero) {
  std::vector<std::string> keys = {"checkpoint.snapshot=" + snapshot,
                                   "model.family=gpt2",
                                   "model.n_layer=2",
                                   "model.d_model=64",
                                   "model.n_head=4",
                                   "model.vocab_size=512",
                                   "model.moe_layers=all",
                                   "model.n_experts=4",
                                   "model.top_k=2",
                                   "model.d_ff_expert=64",
                                   "train.seq_len=32",
                                   "train.micro_batch=2",
                                   "train.grad_accum=2",
                                   "train.steps=10",
                                   "train.threads=1",
                                   "train.eval_every=0",
                                   "data.source=random",
                                   "parallel.tp=1",
                                   "parallel.etp=2",
                                   "parallel.zero=" + std::to_string(zero)};
  return keys;
}

// MoE at ZeRO-2 over dp4 with the GPT-2 experts split over etp 2 (edp 2): every rank stages the
// moments of its shares; those of the experts' output bias, replicated over etp, only the first
// etp rank, so the others receive them.
TEST_P(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDiskOnMoeZero2) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  check_restore(std::string("moe-zero2-") + GetParam(), moe_etp2_keys(GetParam(), 2));
}

// MoE at ZeRO-3, the same model: the parameters too are shares (the experts' over edp 2); those
// of the etp-replicated output bias are staged by the first etp rank and sent to the others,
// and the aux-loss-free bias update leaves no stale copy outside this rank's shares.
TEST_P(CheckpointSnapshot, RestoreFromMemoryEqualsResumeFromDiskOnMoeZero3) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  std::vector<std::string> keys = moe_etp2_keys(GetParam(), 3);
  keys.push_back("moe.bias_update_rate=0.01");
  check_restore(std::string("moe-zero3-") + GetParam(), keys);
}

INSTANTIATE_TEST_SUITE_P(Snapshot, CheckpointSnapshot, ::testing::Values("swap", "copy"));
