// Data parallelism on the mesh: gradient buckets are reduced while backward still runs.
#include <gtest/gtest.h>
#include <mpi.h>

#include "launch/rank.h"
#include "parallel/mesh.h"
#include "parallel/trace.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

using namespace pentad;

TEST(DataParallel, EarlyBucketsCompleteBeforeBackwardEnds) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  // Six layers and small buckets: several buckets per step, and enough backward after the
  // first of them for its all-reduce to finish while later layers still compute.
  Config cfg = parse_recipe(
      "", "overlap-test",
      {"model.n_layer=6", "model.d_model=256", "model.n_head=4", "model.vocab_size=512",
       "model.max_seq_len=128", "train.seq_len=128", "train.micro_batch=4", "train.threads=1",
       "data.source=random", "parallel.bucket_mb=0.5"});
  launch::start_rank(cfg);  // threads and device, as the executable sets them
  parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, world), MPI_COMM_WORLD);
  ASSERT_EQ(mesh.degree(parallel::Axis::DP), world);
  Trainer trainer(cfg, &mesh);
  trainer.train_step(0);  // warm-up
  parallel::clear_comm_events();
  const StepStats s = trainer.train_step(1);

  int buckets = 0, early = 0;
  for (const parallel::CommEvent& e : parallel::comm_events()) {
    if (e.name() != "dp_cp" || e.kind != parallel::CommKind::AllReduce) continue;
    ++buckets;
    EXPECT_GT(e.leave_ns, 0) << "bucket " << e.seq << " never observed complete";
    EXPECT_LE(e.leave_ns, s.reduced_ns);
    if (e.leave_ns < s.backward_end_ns) ++early;
  }
  EXPECT_GE(buckets, 4);
  // Ranks run oversubscribed and skewed, so the fastest may finish backward before any
  // bucket could complete; across the group, some rank must see buckets complete while
  // its own backward still runs.
  int early_anywhere = 0;
  MPI_Allreduce(&early, &early_anywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(early_anywhere, 1) << "no gradient bucket finished before backward ended: no overlap";
  EXPECT_LT(s.backward_end_ns, s.reduced_ns);
}
