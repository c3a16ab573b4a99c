// Pipeline parallelism on 4 ranks: the activation memory each schedule promises, measured
// as the slots the model actually made; the timeline; refusals; the slow-link injection;
// adaptive kFkB's measurements.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>

#include "launch/rank.h"
#include "parallel/mesh.h"
#include "parallel/pp/adaptive.h"
#include "parallel/trace.h"
#include "recipe/recipe.h"
#include "tests/parallel/mpi_test_util.h"
#include "train/trainer.h"

using namespace pentad;

namespace {

using mpi_test::world_size;

Config pipeline_recipe(std::vector<std::string> extra) {
  std::vector<std::string> keys = {
      "model.n_layer=8",      "model.d_model=64",  "model.n_head=4",      "model.vocab_size=512",
      "model.max_seq_len=32", "train.seq_len=32",  "train.micro_batch=2", "train.grad_accum=8",
      "train.threads=1",      "data.source=random"};
  keys.insert(keys.end(), extra.begin(), extra.end());
  return parse_recipe("", "pipeline-test", keys);
}

std::string refusal(const Config& cfg, int world) {
  try {
    mesh_config(cfg, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Pipeline, MeasuredActivationPeaks) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  const int m = 8;
  struct Case {
    const char* schedule;
    int group;
    std::function<int(int stage)> peak;  // micro-batches in flight the schedule promises
  };
  const std::vector<Case> cases = {
      {"gpipe", 1, [&](int) { return m; }},
      {"1f1b", 1, [&](int s) { return std::min(p - s, m); }},
      {"kfkb", 2, [&](int s) { return std::min(2 * (p - s), m); }},
  };
  for (const Case& c : cases) {
    Config cfg = pipeline_recipe({fmt::format("parallel.pp={}", p),
                                  fmt::format("parallel.pp_schedule={}", c.schedule),
                                  fmt::format("parallel.pp_group={}", c.group)});
    launch::start_rank(cfg);  // threads and device, as the executable sets them
    parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, p), MPI_COMM_WORLD);
    Trainer trainer(cfg, &mesh);
    const size_t before = trainer.model().activation_bytes();
    trainer.train_step(0);
    trainer.train_step(1);
    const int stage = mesh.coord(parallel::Axis::PP);
    const int want = c.peak(stage);
    // Slots are made on first use, so the slot count is the measured high-water mark.
    EXPECT_EQ(trainer.pipeline()->peak_in_flight().at(0), want) << c.schedule << " stage " << stage;
    EXPECT_EQ(trainer.model().slots_made(0), want) << c.schedule << " stage " << stage;
    EXPECT_EQ(trainer.model().activation_bytes(),
              before + size_t(want - 1) * trainer.model().slot_bytes(0))
        << c.schedule << " stage " << stage;
  }
}

// zb-v's lists are rebuilt for the measured passes after step 1 and run in step 2; the slots
// the run makes (slots are made on first use: the high-water mark of the three steps) are
// those of the unit-cost lists the memory plan counts, chunk by chunk.
TEST(Pipeline, RebuiltZeroBubbleListsKeepToTheMemoryPlan) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  Config cfg = pipeline_recipe(
      {fmt::format("parallel.pp={}", p), "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"});
  launch::start_rank(cfg);
  parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, p), MPI_COMM_WORLD);
  Trainer trainer(cfg, &mesh);
  for (int step = 0; step < 3; ++step) trainer.train_step(step);
  parallel::pp::ScheduleSpec unit = trainer.pipeline()->schedule();
  EXPECT_FALSE(unit.zb_costs.empty());  // rebuilt
  unit.zb_costs.clear();
  const std::vector<parallel::pp::Action> planned =
      parallel::pp::stage_actions(unit, mesh.coord(parallel::Axis::PP));
  for (int c = 0; c < trainer.model().chunks(); ++c)
    EXPECT_EQ(trainer.model().slots_made(c), parallel::pp::peak_in_flight(planned, c)) << c;
}

// No lists are rebuilt after the run's last step: no step would run them, and the timeline,
// which replays the lists as they are at the end, would replay them as if one had.
TEST(Pipeline, NoListsAreRebuiltAfterTheLastStep) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  Config cfg = pipeline_recipe(
      {fmt::format("parallel.pp={}", p), "parallel.pp_schedule=zb-h1", "train.steps=2"});
  launch::start_rank(cfg);
  parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, p), MPI_COMM_WORLD);
  Trainer trainer(cfg, &mesh);
  for (int step = 0; step < 2; ++step) trainer.train_step(step);  // step 1 is the last
  EXPECT_TRUE(trainer.pipeline()->schedule().zb_costs.empty());   // the unit-cost lists still
}

TEST(Pipeline, TimelineHasEveryPassAndABubble) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  Config cfg = pipeline_recipe({fmt::format("parallel.pp={}", p), "parallel.pp_schedule=1f1b"});
  launch::start_rank(cfg);  // threads and device, as the executable sets them
  parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, p), MPI_COMM_WORLD);
  Trainer trainer(cfg, &mesh);
  for (int step = 0; step < 3; ++step) trainer.train_step(step);
  int forwards = 0, backwards = 0;
  for (const parallel::pp::Span& s : trainer.pipeline()->spans()) {
    EXPECT_LE(s.start_ns, s.end_ns);
    forwards += s.kind == parallel::pp::Span::Forward;
    backwards += s.kind == parallel::pp::Span::Backward;
  }
  EXPECT_EQ(forwards, 3 * 8);
  EXPECT_EQ(backwards, 3 * 8);
  const std::string path = ::testing::TempDir() + "/pentad-pipeline-trace.json";
  const double bubble = trainer.write_timeline(path);
  if (mesh.world_rank() == 0) {
    EXPECT_GT(bubble, 0.0);  // stages wait at the start and the end of every step
    EXPECT_LT(bubble, 1.0);
  }
}

TEST(Pipeline, RefusalsNameWhatToChange) {
  const int p = world_size();
  if (p < 4) GTEST_SKIP() << "needs mpirun with 4 ranks";
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=4", "model.n_layer=6"}), 4)
                .find("model.n_layer = 6 does not split evenly into parallel.pp = 4"),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=4", "model.n_layer=6"}), 4).find("\"2,2,1,1\""),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=2", "parallel.pp_schedule=interleaved",
                                     "parallel.virtual_stages=2", "train.grad_accum=3"}),
                    4)
                .find("train.grad_accum = 3 is not a multiple of 2"),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=4", "parallel.pp_schedule=interleaved",
                                     "parallel.virtual_stages=4"}),
                    4)
                .find("cannot fill parallel.pp = 4 x parallel.virtual_stages = 4"),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=2", "parallel.pp_layout=3,4"}), 4)
                .find("adds up to 7 layers but model.n_layer = 8"),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=2", "parallel.virtual_stages=2"}), 4)
                .find("parallel.pp_schedule = \"interleaved\""),
            std::string::npos);
  EXPECT_NE(refusal(pipeline_recipe({"parallel.pp=3"}), 4).find("parallel.pp"), std::string::npos);
}

// The adaptive schedules' collective half: every stage gets every stage's measure in stage order,
// and the link time is the slowest link's, on every stage.
TEST(Pipeline, AdaptiveMeasuresEveryStageAndTheSlowestLink) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  auto stages = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "stages");
  const int rank = stages->rank();
  const std::vector<parallel::pp::StageMeasure> all =
      parallel::pp::gather_measures(*stages, {1.0 + rank, 2.0 + rank, 100.0 * rank});
  ASSERT_EQ(all.size(), size_t(n));
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(all[size_t(s)].forward_seconds, 1.0 + s);
    EXPECT_EQ(all[size_t(s)].backward_seconds, 2.0 + s);
    EXPECT_EQ(all[size_t(s)].slot_bytes, 100.0 * s);
  }
  // The zero-bubble costs: two chunks' forward, B and W per stage, in stage order, then the
  // link.
  std::vector<double> mine;
  for (int i = 0; i < 6; ++i) mine.push_back(10.0 * rank + i);
  const std::vector<double> costs = parallel::pp::gather_zero_bubble_costs(*stages, mine, 0.5);
  ASSERT_EQ(costs.size(), size_t(6 * n + 1));
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < 6; ++i) EXPECT_EQ(costs[size_t(6 * s + i)], 10.0 * s + i);
  EXPECT_EQ(costs.back(), 0.5);
  const double delay = 0.2;
  EXPECT_LT(parallel::pp::measure_link_seconds(*stages, 1024), delay / 2);
  stages->set_injection({delay, n - 2, 0, /*links_only=*/true});  // one slow link, the last
  const double slow = parallel::pp::measure_link_seconds(*stages, 1024);
  EXPECT_GE(slow, delay / 2);  // half of a round trip that crossed it once
  double lowest = slow;
  stages->set_injection({});
  stages->all_reduce(view_of(&lowest, Shape{1}, DType::F64), parallel::ReduceOp::Min);
  EXPECT_EQ(lowest, slow);  // the same on every stage
}

TEST(Pipeline, SlowLinkDelaysDeliveryNotTheSender) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto comm = parallel::make_communicator(parallel::Backend::MPI, MPI_COMM_WORLD, "slow_p2p");
  const double delay = 0.2;
  comm->set_injection(parallel::Injection{delay, 0, 0});  // rank 0's outgoing links
  std::vector<float> x(16, float(rank));
  comm->barrier();
  if (rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    parallel::Work w = comm->send(view_of(x.data(), Shape{16}), 1, 7, true);
    const double posted =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(posted, delay / 4) << "the sender was held up";
    w.wait();
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              delay);
  } else if (rank == 1) {
    const auto start = std::chrono::steady_clock::now();
    comm->recv(view_of(x.data(), Shape{16}), 0, 7);
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              delay * 0.9);
    EXPECT_EQ(x[0], 0.0f);
  }
  comm->set_injection({});
  comm->barrier();
}
