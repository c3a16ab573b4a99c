// The staged communicator (parallel/staged_comm.cpp) beyond its table of operations
// (staged_comm_test.cpp): pentad's rings on the staging bitwise the MPI backend's, several
// operations in flight completed out of order, one trace event per operation, u16 sums
// refused. Then the backend choice (parallel/backend_choice.h) on tables of ranks' places,
// and a training run on a mesh of staged communicators bitwise against the same run over
// MPI. Runs on 2, 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "launch/rank.h"
#include "parallel/backend_choice.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/trace.h"
#include "plan/layout.h"
#include "recipe/recipe.h"
#include "staged_comm_test_util.h"
#include "train/trainer.h"

namespace pentad::parallel {
namespace {

using namespace staged_comm_test_util;

// pentad's rings (the f32 sum all-reduce when asked for, every f32 sum reduce_scatter_v) run
// on the staged copies with the ring's fixed order: bitwise the MPI backend's rings, whose
// sums differ in the last bits from MPI's own all-reduce on these values.
TEST_F(StagedComm, RingsOnTheStagingMatchTheMpiBackendsRings) {
  staged->set_ring_all_reduce(true);
  mpi->set_ring_all_reduce(true);
  const int r = staged->rank(), n = staged->size();
  for (int64_t k : {1, 5, 1000, 70001}) {
    std::vector<float> x(static_cast<size_t>(k)), y;
    for (int64_t i = 0; i < k; ++i) x[size_t(i)] = 1.0f / float(1 + (i * 7 + r * 13) % 97);
    y = x;
    staged->all_reduce(view_of(x.data(), Shape{k}, DType::F32));
    mpi->all_reduce(view_of(y.data(), Shape{k}, DType::F32));
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << "all_reduce " << k;

    std::vector<int64_t> counts(static_cast<size_t>(n), k);
    counts[0] = k / 2;
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::vector<float> in(static_cast<size_t>(total)), a(static_cast<size_t>(k), -1.0f),
        b(static_cast<size_t>(k), -1.0f);
    for (int64_t i = 0; i < total; ++i) in[size_t(i)] = 1.0f / float(1 + (i * 5 + r * 11) % 89);
    Work wa = staged->reduce_scatter_v(view_of(a.data(), Shape{k}, DType::F32),
                                       view_of(in.data(), Shape{total}, DType::F32), counts,
                                       ReduceOp::Sum, true);
    Work wb = mpi->reduce_scatter_v(view_of(b.data(), Shape{k}, DType::F32),
                                    view_of(in.data(), Shape{total}, DType::F32), counts,
                                    ReduceOp::Sum, true);
    wa.wait();
    wb.wait();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << "reduce_scatter_v " << k;
  }
}

// Several operations in flight at once, each with its own staging block, completed out of
// order: test() drives them (no progress thread), and each lands in its own tensor. Then
// the blocks are reused: the same again gives the same.
TEST_F(StagedComm, OperationsInFlightTogetherCompleteOutOfOrder) {
  const int r = staged->rank(), n = staged->size();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> bufs(6, std::vector<float>(33));
    std::vector<Work> works;
    for (size_t j = 0; j < bufs.size(); ++j) {
      for (size_t i = 0; i < bufs[j].size(); ++i)
        bufs[j][i] = float(r + 1) * float(j + 1) + float(i);
      works.push_back(staged->all_reduce(view_of(bufs[j].data(), Shape{33}, DType::F32),
                                         j % 2 ? ReduceOp::Max : ReduceOp::Sum, true));
    }
    for (size_t j = works.size(); j-- > 0;) {
      while (!works[j].test()) {
      }
      EXPECT_TRUE(works[j].done());
    }
    for (size_t j = 0; j < bufs.size(); ++j)
      for (size_t i = 0; i < bufs[j].size(); ++i) {
        const float want = j % 2 ? float(n) * float(j + 1) + float(i)
                                 : float(n * (n + 1) / 2) * float(j + 1) + float(n) * float(i);
        ASSERT_EQ(bufs[j][i], want) << "round " << round << " op " << j << " element " << i;
      }
  }
}

// One trace event per operation, on the staged communicator's channel, with the interface's
// bytes; the MPI communicator inside records none of its own.
TEST_F(StagedComm, TraceHasOneEventPerOperation) {
  clear_comm_events();
  std::vector<float> x(10, 1.0f), g(size_t(10 * staged->size()));
  staged->all_reduce(view_of(x.data(), Shape{10}, DType::F32));
  staged->all_gather(view_of(g.data(), Shape{int64_t(g.size())}, DType::F32),
                     view_of(x.data(), Shape{10}, DType::F32));
  int events = 0;
  for (const CommEvent& e : comm_events()) {
    ASSERT_EQ(e.name(), "staged") << "an event on another channel: " << e.name();
    EXPECT_GT(e.leave_ns, 0) << "seq " << e.seq << " never seen complete";
    EXPECT_EQ(e.bytes, 40) << comm_kind_name(e.kind);
    EXPECT_EQ(e.seq, uint64_t(events));
    ++events;
  }
  EXPECT_EQ(events, 2);
}

TEST_F(StagedComm, RefusesToAddU16) {
  std::vector<uint16_t> words(4, 1);
  try {
    staged->all_reduce(view_of(words.data(), Shape{4}, DType::U16));
    FAIL() << "a u16 sum was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staged backend reduces"), std::string::npos) << e.what();
  }
}

// ---- the choice of backend ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendChoice, CpuRunsTakeMpiUnlessStagedIsForced) {
  const std::vector<RankPlace> cpu(4, RankPlace{"node0", ""});
  EXPECT_EQ(choose_backend("auto", false, true, cpu).backend, Backend::MPI);
  EXPECT_EQ(choose_backend("auto", false, true, cpu).reason, "");  // nothing logged
  EXPECT_EQ(choose_backend("staged", false, true, cpu).backend, Backend::Staged);
  EXPECT_EQ(choose_backend("staged", false, false, cpu).backend, Backend::Staged);
  const std::string nccl = error_of([&] { choose_backend("nccl", false, true, cpu); });
  EXPECT_NE(nccl.find("parallel.comm_backend = \"nccl\" needs train.device = \"cuda\""),
            std::string::npos)
      << nccl;
  const std::string bad = error_of([&] { choose_backend("gloo", false, true, cpu); });
  EXPECT_NE(bad.find("parallel.comm_backend = \"gloo\""), std::string::npos) << bad;
  EXPECT_NE(bad.find("\"staged\""), std::string::npos) << bad;
}

TEST(BackendChoice, GpusSharedByTwoRanksTakeStagedAndSayWhich) {
  // (host, PCI bus id) per world rank -> backend with "auto", NCCL built.
  struct Row {
    std::vector<RankPlace> places;
    Backend want;
    std::string reason_has;
  };
  const std::vector<Row> table = {
      {{{"a", "0000:01:00.0"}, {"a", "0000:02:00.0"}}, Backend::NCCL, "a GPU of its own"},
      // The same bus id on two machines is two GPUs.
      {{{"a", "0000:01:00.0"}, {"b", "0000:01:00.0"}}, Backend::NCCL, "a GPU of its own"},
      {{{"a", "0000:01:00.0"}, {"a", "0000:01:00.0"}},
       Backend::Staged,
       "ranks 0 and 1 share GPU 0000:01:00.0 on a (NCCL takes one GPU per rank)"},
      // 8 ranks on one H200: the first pair named.
      {std::vector<RankPlace>(8, RankPlace{"h200", "0000:9a:00.0"}), Backend::Staged,
       "ranks 0 and 1 share GPU 0000:9a:00.0 on h200"},
      // Two machines of 2 GPUs, 3 ranks each: ranks 3 and 5 share b's first GPU.
      {{{"a", "0000:01:00.0"},
        {"a", "0000:02:00.0"},
        {"a", "0000:03:00.0"},
        {"b", "0000:01:00.0"},
        {"b", "0000:02:00.0"},
        {"b", "0000:01:00.0"}},
       Backend::Staged,
       "ranks 3 and 5 share GPU 0000:01:00.0 on b"},
      {{{"a", "0000:01:00.0"}}, Backend::NCCL, "a GPU of its own"},
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const BackendChoice got = choose_backend("auto", true, true, table[i].places);
    EXPECT_EQ(got.backend, table[i].want) << "row " << i << ": " << got.reason;
    EXPECT_NE(got.reason.find(table[i].reason_has), std::string::npos)
        << "row " << i << ": " << got.reason;
  }
  const std::vector<RankPlace>& shared = table[2].places;
  const std::vector<RankPlace>& own = table[0].places;
  // Forced either way; NCCL refused where it cannot run, naming the key and the ranks.
  EXPECT_EQ(choose_backend("staged", true, true, own).backend, Backend::Staged);
  EXPECT_EQ(choose_backend("nccl", true, true, own).backend, Backend::NCCL);
  const std::string refused = error_of([&] { choose_backend("nccl", true, true, shared); });
  EXPECT_NE(refused.find("parallel.comm_backend = \"nccl\" but ranks 0 and 1 share GPU"),
            std::string::npos)
      << refused;
  // Without NCCL: staged, said so; "nccl" refused.
  const BackendChoice no_nccl = choose_backend("auto", true, false, own);
  EXPECT_EQ(no_nccl.backend, Backend::Staged);
  EXPECT_NE(no_nccl.reason.find("built without NCCL"), std::string::npos) << no_nccl.reason;
  EXPECT_NE(error_of([&] { choose_backend("nccl", true, false, own); }).find("without NCCL"),
            std::string::npos);
}

// The same over MPI: every rank's place gathered, the same answer on every rank.
TEST(BackendChoice, GatheredOverTheWorld) {
  if (world_size() < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
  const int r = world_rank();
  const Backend own = select_backend("auto", true, "gpu" + std::to_string(r), MPI_COMM_WORLD);
  EXPECT_EQ(own, backend_available(Backend::NCCL) ? Backend::NCCL : Backend::Staged);
  // Ranks 2q and 2q + 1 on one GPU: shared.
  EXPECT_EQ(select_backend("auto", true, "gpu" + std::to_string(r / 2), MPI_COMM_WORLD),
            Backend::Staged);
  // Only the last rank shares with the one before it (3 or more ranks): still staged, everywhere.
  const int n = world_size();
  const std::string last = "gpu" + std::to_string(r == n - 1 ? n - 2 : r);
  EXPECT_EQ(select_backend("auto", true, last, MPI_COMM_WORLD), Backend::Staged);
  EXPECT_EQ(select_backend("auto", false, "", MPI_COMM_WORLD), Backend::MPI);
}

// ---- training through staged communicators ----

// A tiny model trained 3 steps on a mesh of staged communicators (chosen as the executable
// chooses, from parallel.comm_backend) against the same layout over MPI: the same losses,
// bit for bit. Layout by world size: tp 2 with sequence parallelism, dp (ZeRO-1 at 4 ranks
// and more), pp 2 at 8.
std::vector<float> train_losses(const std::string& comm_backend) {
  const int n = world_size();
  std::vector<std::string> keys = {"model.n_layer=2",
                                   "model.d_model=64",
                                   "model.n_head=4",
                                   "model.vocab_size=256",
                                   "model.max_seq_len=32",
                                   "train.seq_len=32",
                                   "train.micro_batch=2",
                                   "train.grad_accum=2",
                                   "train.threads=1",
                                   "data.source=random",
                                   "train.eval_every=0",
                                   "parallel.tp=2",
                                   "parallel.sequence_parallel=true",
                                   "parallel.comm_backend=" + comm_backend};
  if (n >= 4) keys.push_back("parallel.zero=1");
  if (n >= 8) keys.push_back("parallel.pp=2");
  const Config cfg = parse_recipe("", "staged-layout-test", keys);
  const Backend backend = launch::start_rank(cfg);
  EXPECT_EQ(backend, comm_backend == "staged" ? Backend::Staged : Backend::MPI);
  Mesh mesh = Mesh::create(mesh_config(cfg, n), MPI_COMM_WORLD, backend);
  EXPECT_EQ(mesh.world().backend(), backend);
  Trainer trainer(cfg, &mesh);
  std::vector<float> losses;
  for (int64_t step = 0; step < 3; ++step) losses.push_back(trainer.train_step(step).loss);
  return losses;
}

TEST(StagedTraining, LayoutOverStagedCommunicatorsMatchesMpiBitwise) {
  if (world_size() < 2 || world_size() % 2) GTEST_SKIP() << "needs an even number of ranks";
  const std::vector<float> mpi = train_losses("auto");
  const std::vector<float> staged = train_losses("staged");
  ASSERT_EQ(staged.size(), mpi.size());
  for (size_t i = 0; i < staged.size(); ++i)
    EXPECT_EQ(0, std::memcmp(&staged[i], &mpi[i], sizeof(float)))
        << "step " << i + 1 << ": staged " << staged[i] << ", MPI " << mpi[i];
  EXPECT_TRUE(std::isfinite(staged.back()));
}

}  // namespace
}  // namespace pentad::parallel
