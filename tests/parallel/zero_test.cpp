// ZeRO's sharded gradient reduction (parallel/dp/grad_reducer.h) on the ranks of the world:
// shares tile the arena at row boundaries, each rank's is its fair part, the reduce-scatter
// sums them, stage 2 keeps the full gradients in memory only bucket by bucket, and stage 3's
// parameter arena backs this rank's shares only, gathers each unit into a buffer of its own
// (the share read from elsewhere, when kept there) and re-derives a bf16 model's compute copy
// of each unit it gathers.
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/ops.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/dp/grad_reducer.h"
#include "tests/parallel/mpi_test_util.h"

using namespace pentad;

namespace {

using mpi_test::world_size;

// A GPT-like table at width 256: a 2048-row embedding, four layers of matrices and biases
// (row lengths 256 and 1024, and 1-D tensors), a final norm. About 3.7M values, 15 MiB.
ParamStore gpt_like(int stage, Placement placement = {}) {
  placement.sparse_grads = stage >= 2;  // as the trainer's, for this stage
  placement.sparse_params = stage == 3;
  ParamStore p;
  const int64_t C = 256;
  p.add("wte.weight", Shape{2048, C}, Init::Normal, 0.02f, true);
  for (int l = 0; l < 4; ++l) {
    const std::string at = "layers." + std::to_string(l) + ".";
    p.add(at + "norm1.weight", Shape{C}, Init::Ones, 0, false);
    p.add(at + "attn.qkv.weight", Shape{3 * C, C}, Init::Normal, 0.02f, true);
    p.add(at + "attn.qkv.bias", Shape{3 * C}, Init::Zeros, 0, false);
    p.add(at + "attn.o.weight", Shape{C, C}, Init::Normal, 0.02f, true);
    p.add(at + "mlp.up.weight", Shape{4 * C, C}, Init::Normal, 0.02f, true);
    p.add(at + "mlp.down.weight", Shape{C, 4 * C}, Init::Normal, 0.02f, true);
  }
  p.add("norm_f.weight", Shape{C}, Init::Ones, 0, false);
  p.allocate(placement);
  return p;
}

// Resident memory says nothing under AddressSanitizer (its shadow and quarantine grow with
// every write): the memory tests run in the plain build only.
// GCC defines __SANITIZE_ADDRESS__; clang 14 (the sanitizer builds' compiler) only answers
// __has_feature.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasuresMemory = false;
#elif defined(__has_feature)
constexpr bool kMeasuresMemory = !__has_feature(address_sanitizer);
#else
constexpr bool kMeasuresMemory = true;
#endif

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

// ZeRO-3's units: one per layer, one for what comes before and after the layers.
std::string unit_key(const ParamSpec& s) {
  return s.name.rfind("layers.", 0) == 0 ? s.name.substr(0, s.name.find('.', 7)) : "";
}

// Every parameter's values, in id order, read through the store's accessors.
std::vector<float> whole_values(const ParamStore& p) {
  std::vector<float> all;
  for (int id = 0; id < int(p.specs().size()); ++id) {
    const float* v = p.param(id).f32();
    all.insert(all.end(), v, v + p.spec(id).local_shape.numel());
  }
  return all;
}

// Every rank's (begin, end) ranges, flattened, from all ranks.
std::vector<int64_t> all_ranges(const StateShard& shard) {
  std::vector<int64_t> mine;
  for (const StateShard::Range& r : shard.ranges) mine.insert(mine.end(), {r.begin, r.end});
  int count = int(mine.size()), n = world_size();
  std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), 0);
  std::vector<int64_t> all(size_t(displs.back() + counts.back()));
  MPI_Allgatherv(mine.data(), count, MPI_INT64_T, all.data(), counts.data(), displs.data(),
                 MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

// Every element of the reducer's shares is want(its arena offset).
void expect_shares(const parallel::GradReducer& reducer, const ParamStore& p,
                   const std::function<float(int64_t)>& want, const std::string& what) {
  const float* reduced = reducer.shard_grads().f32();
  for (const ParamSpec& spec : p.specs())
    for (const StateShard::Piece& piece : reducer.shard().pieces(spec))
      for (int64_t k = 0; k < piece.count; ++k)
        ASSERT_EQ(reduced[piece.shard + k], want(piece.arena + k))
            << what << spec.name << " element " << piece.arena + k;
}

}  // namespace

TEST(Zero, SharesTileTheArenaAtRowsAndAreFair) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  ParamStore p = gpt_like(1);
  parallel::GradReducer reducer(*group, p, size_t{1} << 20, 1);
  const StateShard& shard = reducer.shard();
  // Each share of a parameter is whole rows of it (pieces() checks) ...
  int64_t owned = 0;
  for (const ParamSpec& spec : p.specs())
    for (const StateShard::Piece& piece : shard.pieces(spec)) owned += piece.count;
  // ... the ranks' shares cover every parameter element exactly once ...
  std::vector<int> cover(size_t(p.numel()), 0);
  const std::vector<int64_t> all = all_ranges(shard);
  for (size_t i = 0; i < all.size(); i += 2)
    for (int64_t e = all[i]; e < all[i + 1]; ++e) ++cover[size_t(e)];
  for (const ParamSpec& spec : p.specs())
    for (int64_t e = 0; e < spec.local_shape.numel(); ++e)
      ASSERT_EQ(cover[spec.offset + size_t(e)], 1) << spec.name << " element " << e;
  // ... and each rank's part is within 5% of N / D (the formula the memory plan states).
  const double fair = double(p.numel()) / D;
  EXPECT_NEAR(double(shard.numel), fair, 0.05 * fair);
  EXPECT_NEAR(double(owned), fair, 0.05 * fair);
  // AdamW keeps m and v for the shares only (each arena rounded up to whole pages).
  AdamW opt(OptimConfig{}, p, shard);
  const size_t moments = 2 * size_t(shard.numel) * sizeof(float);
  EXPECT_GE(opt.state_bytes(), moments);
  EXPECT_LE(opt.state_bytes(), moments + 2 * Arena::kPageBytes);
}

TEST(Zero, ReduceScatterSumsEachShareAndGatherRestoresParameters) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  const int r = group->rank();
  for (int stage : {1, 2}) {
    ParamStore p = gpt_like(stage);
    parallel::GradReducer reducer(*group, p, size_t{1} << 18, stage);
    float* w = p.all_params().f32();
    auto value = [](int rank, int64_t e) { return float(rank + 1) * float(e % 1000) * 0.5f; };
    for (int micro = 0; micro < 2; ++micro) {  // stage 2 reduces each micro-batch, adding up
      if (micro == 0) reducer.begin_step();
      for (int id = 0; id < int(p.specs().size()); ++id) {  // stage 2: homes from the reducer
        float* const g = p.grad(id).f32();
        for (int64_t e = 0; e < p.spec(id).local_shape.numel(); ++e)
          g[e] += value(r, int64_t(p.spec(id).offset) + e);
      }
      if (stage == 2 || micro == 1) {
        reducer.ready_from(0);
        reducer.finish();
      }
    }
    const float ranks_sum = float(D * (D + 1) / 2);
    expect_shares(
        reducer, p, [&](int64_t e) { return 2 * ranks_sum * float(e % 1000) * 0.5f; },
        "stage " + std::to_string(stage) + " ");
    // Each rank writes its shares of the parameters; the all-gather completes them.
    for (int64_t e = 0; e < p.numel(); ++e) w[e] = -1.0f;
    for (const StateShard::Range& range : reducer.shard().ranges)
      for (int64_t e = range.begin; e < range.end; ++e) w[e] = float(e);
    reducer.gather_params();
    for (const ParamSpec& spec : p.specs())
      for (int64_t e = int64_t(spec.offset); e < int64_t(spec.offset) + spec.local_shape.numel();
           ++e)
        ASSERT_EQ(w[e], float(e)) << spec.name;
  }
}

// Stage 2 under pipelining: a stage's two chunks (the embedding and layers 0-1, layers 2-3
// and the final norm) finish their gradients in turn, one micro-batch's at a time and in no
// fixed chunk order; each pass reduces its chunk's buckets inside a window. Every share ends
// up the sum over ranks and micro-batches, each bucket's first reduction of the step
// overwriting what the step before left; a window that cuts a bucket is refused.
TEST(Zero, StageTwoReducesOneChunkAtATimeInWindows) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  const int r = group->rank();
  ParamStore p = gpt_like(2);
  const int64_t cut = int64_t(p.spec(p.find("layers.2.norm1.weight")).offset);
  parallel::GradReducer reducer(*group, p, size_t{1} << 18, 2, {}, {}, [cut](const ParamSpec& s) {
    return std::string(int64_t(s.offset) < cut ? "0" : "1");
  });
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, cut}, {cut, p.numel()}};
  auto value = [](int rank, int64_t e) { return float(rank + 1) * float(e % 1000) * 0.25f; };
  // Chunk 1 runs micro-batches 0 and 1, then chunk 0 micro-batch 0, chunk 1 micro-batch 2,
  // chunk 0 micro-batches 1 and 2 (as a pipeline stage's lists interleave them).
  const std::vector<int> passes = {1, 1, 0, 1, 0, 0};
  for (int step = 0; step < 2; ++step) {
    reducer.begin_step();
    for (int c : passes) {
      reducer.set_window(chunks[size_t(c)].first, chunks[size_t(c)].second);
      for (int id = int(p.specs().size()); id-- > 0;) {  // backward order
        const ParamSpec& spec = p.spec(id);
        if (int64_t(spec.offset) < chunks[size_t(c)].first ||
            int64_t(spec.offset) >= chunks[size_t(c)].second)
          continue;
        float* const g = p.grad(id).f32();
        for (int64_t e = 0; e < spec.local_shape.numel(); ++e)
          g[e] += value(r, int64_t(spec.offset) + e);
        reducer.ready_from(int64_t(spec.offset));
      }
      reducer.finish();
      reducer.clear_window();
    }
  }
  const float ranks_sum = float(D * (D + 1) / 2);
  expect_shares(
      reducer, p, [&](int64_t e) { return 3 * ranks_sum * float(e % 1000) * 0.25f; }, "");
  // The layers' buckets hold one chunk's parameters each; a window through a layer cuts one.
  EXPECT_THROW(reducer.set_window(0, int64_t(p.spec(p.find("layers.1.mlp.up.weight")).offset) + 1),
               std::logic_error);
}

// Stage 2's memory: backward writes the gradients from the end of the arena; each bucket's
// pages go back to the system once it is reduced, so the resident gradient bytes stay far
// below the arena (stage 1 holds all of it). What stage 2 may hold: the reduced shares (S of
// N values), the bucket being written and kInFlight pending ones (a bucket holds whole
// parameters: here the 2 MiB embedding is the largest), and 1 MiB for MPI's own buffers.
// At 4 ranks that is about 0.6 of the arena, whereas stage 1 holds all of it.
TEST(Zero, StageTwoHoldsTheFullGradientsOnlyBucketByBucket) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  if (!kMeasuresMemory) GTEST_SKIP() << "resident memory is not measured under ASan";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  for (int stage : {1, 2}) {
    ParamStore p = gpt_like(stage);
    parallel::GradReducer reducer(*group, p, size_t{1} << 20, stage);
    const size_t base = resident_bytes();
    size_t peak = base;
    const auto& specs = p.specs();
    for (size_t i = specs.size(); i-- > 0;) {  // backward order
      std::fill_n(p.grad(int(i)).f32(), specs[i].local_shape.numel(), 1.0f);
      reducer.ready_from(int64_t(specs[i].offset));
      group->barrier();  // every rank has started the buckets below; let them finish
      reducer.ready_from(int64_t(specs[i].offset));
      peak = std::max(peak, resident_bytes());
    }
    reducer.finish();
    const double held = double(peak - base) / double(p.bytes());
    const double bound =
        (double(reducer.shard().numel +
                int64_t(parallel::GradReducer::kInFlight + 1) * reducer.largest_bucket()) *
             sizeof(float) +
         double(1 << 20)) /
        double(p.bytes());
    if (stage == 1)
      EXPECT_GT(held, 0.9) << "stage 1 keeps the full gradients";
    else
      EXPECT_LT(held, std::min(bound, 0.75))
          << "stage 2 held " << held << " of the gradient arena at once (bound " << bound << ")";
  }
}

// Stage 2 over a step of two micro-batches with a large tied embedding (half the values, as
// GPT-2's vocabulary makes it: written first by the head and last by the embedding, so its
// bucket is whole throughout backward). The second micro-batch adds into the reduced shares
// without a second set of them: after the step only the shares (S = N / D) stay resident (a
// second set to receive the next micro-batch's reduction made it 2S). The gradient buffers
// at their highest (what the pool holds: on CUDA it keeps them all) are within the plan's
// 2 largest buckets, and with S below the full gradient arena that stage 0 keeps (the
// second S put the plan above it, and the pool beside 2S here too).
TEST(Zero, StageTwoAccumulatesIntoTheSharesWithoutASecondSet) {
  const int D = world_size();
  if (D < 4) GTEST_SKIP() << "needs mpirun with at least 4 ranks";
  if (!kMeasuresMemory) GTEST_SKIP() << "resident memory is not measured under ASan";
  // Open MPI's non-blocking reduce-scatter mallocs a scratch of twice the bucket on the ranks
  // it reduces to; with glibc's sliding mmap threshold its pages would stay after the free.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  ParamStore p;
  const int64_t C = 256;
  p.add("wte.weight", Shape{12288, C}, Init::Normal, 0.02f, true);  // (V, C): 3.1M values
  for (int l = 0; l < 4; ++l) {
    const std::string at = "layers." + std::to_string(l) + ".";
    p.add(at + "attn.qkv.weight", Shape{3 * C, C}, Init::Normal, 0.02f, true);
    p.add(at + "attn.o.weight", Shape{C, C}, Init::Normal, 0.02f, true);
    p.add(at + "mlp.up.weight", Shape{4 * C, C}, Init::Normal, 0.02f, true);
    p.add(at + "mlp.down.weight", Shape{C, 4 * C}, Init::Normal, 0.02f, true);
  }
  Placement placement;
  placement.sparse_grads = true;
  p.allocate(placement);
  parallel::GradReducer reducer(*group, p, size_t{1} << 20, 2);
  const double shares = double(reducer.shard().numel) * sizeof(float);
  const size_t base = resident_bytes();
  const auto& specs = p.specs();
  for (int micro = 0; micro < 2; ++micro) {
    if (micro == 0) reducer.begin_step();
    std::fill_n(p.grad(0).f32(), specs[0].local_shape.numel(), 1.0f);  // the tied head
    for (size_t i = specs.size(); i-- > 0;) {                          // backward order
      float* const g = p.grad(int(i)).f32();
      for (int64_t e = 0; e < specs[i].local_shape.numel(); ++e) g[e] += 1.0f;
      reducer.ready_from(int64_t(specs[i].offset));
      group->barrier();  // every rank has started the buckets below; let them finish
      reducer.ready_from(int64_t(specs[i].offset));
    }
    reducer.finish();
  }
  // Correct as well as small: every reduced element is D ranks x 2 micro-batches x (2 for
  // the embedding's two writes, else 1).
  const float* reduced = reducer.shard_grads().f32();
  for (const ParamSpec& spec : specs)
    for (const StateShard::Piece& piece : reducer.shard().pieces(spec))
      for (int64_t k = 0; k < piece.count; k += 97)
        ASSERT_EQ(reduced[piece.shard + k], float(2 * D * (spec.name == "wte.weight" ? 2 : 1)))
            << spec.name;
  const double after = double(resident_bytes()) - double(base);
  EXPECT_LT(after, shares + double(1 << 20))
      << "after the step: " << after / shares << " S resident, want the shares alone";
  const double buffers = double(reducer.pool_bytes()), arena = double(p.bytes());
  const double two_buckets = 2 * double(reducer.largest_bucket()) * sizeof(float);
  EXPECT_LE(buffers, two_buckets) << "the plan's 2 buckets";
  EXPECT_LT(buffers + shares, arena) << "stage 0 holds the whole gradient arena";
}

// Stage 3's parameters: one bucket per layer. The arena backs this rank's shares only (to
// within a page at each end of a share); with every unit gathered the units' buffers hold the
// whole model, and after release they go: the difference is all N values, to within 5%.
TEST(Zero, StageThreeBacksThisRanksSharesOfTheParametersOnly) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  ParamStore p = gpt_like(3);
  parallel::GradReducer reducer(*group, p, size_t{1} << 20, 3, {}, {}, unit_key);
  p.initialize(7);  // as the trainer does: after the reducers, so only the shares are written
  EXPECT_EQ(reducer.buckets_count(), 6);  // embedding, four layers, final norm
  const double shares = double(reducer.shard().numel) * sizeof(float);
  EXPECT_NEAR(double(p.committed_param_bytes()), shares,
              double(2 * reducer.buckets_count()) * double(Arena::kPageBytes));
  const size_t before = resident_bytes();
  for (int b = 0; b < reducer.buckets_count(); ++b) reducer.acquire(b);
  const size_t whole = resident_bytes();
  for (int b = 0; b < reducer.buckets_count(); ++b) reducer.release(b);
  const size_t after = resident_bytes();
  if (kMeasuresMemory) {
    const double all = double(p.numel()) * sizeof(float);
    EXPECT_NEAR(double(whole) - double(before), all, 0.05 * all) << "the units' buffers";
    EXPECT_NEAR(double(whole) - double(after), all, 0.05 * all) << "released, they go";
  }
  // Nothing reads a unit outside its gather: the model's accessors refuse, naming it.
  EXPECT_THROW(p.param(0), std::exception);
}

// Stage 3 with MoE (the trainer's build_reducers): the dense parameters' units over the whole
// group, the routed experts' over their replicas (edp: pairs of ranks here), each layer's
// experts one unit of the second reducer. The arena backs each rank's shares of both, which
// initialize() fills; acquired, every unit reads whole, bitwise what one rank draws.
TEST(Zero, StageThreeWithMoeShardsTheExpertsOverTheirOwnGroup) {
  const int D = world_size();
  if (D < 4 || D % 2 != 0) GTEST_SKIP() << "needs mpirun with an even number of ranks >= 4";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm pairs;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pairs);
  auto dense_group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  auto edp_group = parallel::make_communicator(parallel::Backend::MPI, pairs, "edp");
  auto moe_like = [](Placement placement) {
    ParamStore p;
    const int64_t C = 256;
    p.add("wte.weight", Shape{2048, C}, Init::Normal, 0.02f, true);
    for (int l = 0; l < 4; ++l) {
      const std::string at = "layers." + std::to_string(l) + ".";
      p.add(at + "attn.qkv.weight", Shape{3 * C, C}, Init::Normal, 0.02f, true);
      p.add(at + "moe.router.weight", Shape{4, C}, Init::Normal, 0.02f, true);
      for (int e = 0; e < 2; ++e) {
        const std::string ex = at + "moe.experts." + std::to_string(e) + ".";
        p.mark_expert(p.add(ex + "up.weight", Shape{2 * C, C}, Init::Normal, 0.02f, true));
        p.mark_expert(p.add(ex + "down.weight", Shape{C, 2 * C}, Init::Normal, 0.02f, true));
      }
    }
    p.allocate(placement);
    return p;
  };
  ParamStore one = moe_like({});
  one.initialize(7);
  const std::vector<float> want(one.all_params().f32(), one.all_params().f32() + one.numel());
  ParamStore p = moe_like({Device::CPU, DType::F32, true, true});
  parallel::GradReducer dense(
      *dense_group, p, size_t{1} << 20, 3, [](const ParamSpec& s) { return !s.expert; }, {},
      unit_key);
  parallel::GradReducer experts(
      *edp_group, p, size_t{1} << 20, 3, [](const ParamSpec& s) { return s.expert; }, {}, unit_key);
  p.initialize(7);
  EXPECT_EQ(dense.buckets_count(), 5);    // embedding, four layers' attention and router
  EXPECT_EQ(experts.buckets_count(), 4);  // four layers' experts
  int64_t expert_values = 0;
  for (const ParamSpec& s : p.specs()) expert_values += s.expert ? s.local_shape.numel() : 0;
  EXPECT_EQ(experts.shard().numel, expert_values / 2) << "the experts' shares over edp 2";
  const float* values = p.all_params().f32();
  int64_t wrong = 0;
  for (const StateShard* shard : {&dense.shard(), &experts.shard()})
    for (const StateShard::Range& r : shard->ranges)
      for (int64_t i = r.begin; i < r.end; ++i) wrong += values[i] != want[size_t(i)];
  EXPECT_EQ(wrong, 0) << "this rank's shares of both reducers, as one rank draws them";
  const double shares = double(dense.shard().numel + experts.shard().numel) * sizeof(float);
  EXPECT_NEAR(double(p.committed_param_bytes()), shares, 18.0 * double(Arena::kPageBytes))
      << "backed: the shares of both, to within a page at each end of each";
  for (int b = 0; b < dense.buckets_count(); ++b) dense.acquire(b);
  for (int b = 0; b < experts.buckets_count(); ++b) experts.acquire(b);
  EXPECT_EQ(whole_values(p), whole_values(one)) << "gathered whole";
  MPI_Comm_free(&pairs);
}

// Stage 3 with this rank's shares kept outside the arena (ZeRO-Infinity; the trainer keeps
// them on NVMe): the arena backs none of them (a read of it would fault), read_ahead()
// starts only the read, and acquire() brings each unit whole, bitwise the values written,
// with the share read straight into the unit's buffer.
TEST(Zero, StageThreeWithSharesElsewhereReadsThemIntoTheUnit) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  ParamStore one = gpt_like(1);
  one.initialize(7);
  const std::vector<float> want(one.all_params().f32(), one.all_params().f32() + one.numel());
  ParamStore p = gpt_like(3);
  // The store: this rank's shares in the compact layout; reads land when waited for.
  std::vector<float> store;
  int started = 0, landed = 0;
  parallel::GradReducer reducer(*group, p, size_t{1} << 20, 3, {}, {}, unit_key,
                                [&](int64_t shard, int64_t count, float* into) {
                                  ++started;
                                  return parallel::GradReducer::Arrival([&, shard, count, into] {
                                    std::copy_n(store.begin() + shard, count, into);
                                    ++landed;
                                  });
                                });
  EXPECT_EQ(p.committed_param_bytes(), 0u) << "the arena backs none of the shares";
  store.resize(size_t(reducer.shard().numel));
  for (const StateShard::Range& r : reducer.shard().ranges)
    std::copy(want.begin() + r.begin, want.begin() + r.end, store.begin() + r.shard);
  reducer.release_all();
  reducer.read_ahead(2);
  EXPECT_EQ(started, 1);
  EXPECT_EQ(landed, 0) << "read_ahead() only starts the read";
  for (int b = 0; b < reducer.buckets_count(); ++b) reducer.acquire(b);
  EXPECT_EQ(landed, reducer.buckets_count()) << "each unit's share read once";
  EXPECT_EQ(whole_values(p), whole_values(one)) << "gathered whole";
  for (int b = 0; b < reducer.buckets_count(); ++b) reducer.release(b);
}

// Stage 3 with a bf16 compute copy (CUDA's bf16 runs; the CPU store takes the same layout):
// after an optimizer step each rank has changed its own shares only; acquire() must give the
// whole unit a copy equal to the bf16 rounding of the gathered fp32 values, on every gather,
// not only the first.
TEST(Zero, StageThreeRefreshesTheComputeCopyOfEachGatheredUnit) {
  const int D = world_size();
  if (D < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto group = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "dp");
  ParamStore p = gpt_like(3, {Device::CPU, DType::BF16});
  parallel::GradReducer reducer(*group, p, size_t{1} << 20, 3, {}, {}, unit_key);
  p.initialize(7);
  reducer.release_all();
  float* const values = p.all_params().f32();
  for (int round = 1; round <= 2; ++round) {
    // "The optimizer": this rank moves its own shares by far more than a bf16 step.
    for (const StateShard::Range& r : reducer.shard().ranges)
      for (int64_t i = r.begin; i < r.end; ++i) values[i] += float(round * (rank + 1));
    for (int b = 0; b < reducer.buckets_count(); ++b) reducer.acquire(b);
    int64_t stale = 0;
    for (int id = 0; id < int(p.specs().size()); ++id) {
      const float* v = p.param(id).f32();
      const auto* copy = static_cast<const uint16_t*>(p.weight(id).data);
      for (int64_t i = 0; i < p.spec(id).local_shape.numel(); ++i)
        stale += copy[i] != float_to_bf16(v[i]) ? 1 : 0;
    }
    EXPECT_EQ(stale, 0) << "round " << round << ": compute copy elements that do not match the "
                        << "gathered fp32 values, of " << p.numel();
    for (int b = 0; b < reducer.buckets_count(); ++b) reducer.release(b);
  }
}
