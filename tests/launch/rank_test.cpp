// Rank start-up (launch/rank.h): the compute threads a rank gets, and a clear refusal when
// a recipe asks for a GPU that is not there.
#include "launch/rank.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <string>

#include "core/check.h"
#include "core/device_memory.h"

using namespace pentad;

namespace {

TEST(ComputeThreads, ExplicitCountOrTheCoresSharedAmongTheRanks) {
  const int cores = omp_get_num_procs();
  launch::set_compute_threads(3);
  EXPECT_EQ(omp_get_max_threads(), 3);
  launch::set_compute_threads(0, 1);
  EXPECT_EQ(omp_get_max_threads(), cores);
  launch::set_compute_threads(0, 2);
  EXPECT_EQ(omp_get_max_threads(), std::max(1, cores / 2));
  launch::set_compute_threads(0, 4 * cores);  // more ranks than cores: one thread each
  EXPECT_EQ(omp_get_max_threads(), 1);
}

// Without MPI (a test, or a tool) a rank is alone on its machine.
TEST(StartRank, OneRankAloneWithoutMpi) {
  const launch::NodePlace place = launch::node_place();
  EXPECT_EQ(place.rank, 0);
  EXPECT_EQ(place.size, 1);
  Config cfg;
  cfg.train.threads = 2;
  EXPECT_EQ(launch::start_rank(cfg), parallel::Backend::MPI);
  EXPECT_EQ(omp_get_max_threads(), 2);
}

// Asking for a GPU where there is none (or in a build without CUDA) is a clear error, not
// a crash or a silent CPU run.
TEST(StartRank, CudaWithoutADeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  Config cfg;
  cfg.train.device = "cuda";
  try {
    launch::start_rank(cfg);
    ADD_FAILURE() << "a CUDA rank started without a device";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.find("no CUDA device is visible") != std::string::npos ||
                message.find("no CUDA backend") != std::string::npos)
        << message;
  }
}

}  // namespace
