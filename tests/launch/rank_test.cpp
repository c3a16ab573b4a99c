// Rank start-up (launch/rank.h): the compute threads a rank gets, and a clear refusal when
// a recipe asks for a GPU that is not there.
#include "launch/rank.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/cgroup.h"
#include "core/check.h"
#include "core/device_memory.h"

using namespace pentad;

namespace {

// The environments srun, sbatch and mpirun give a rank (as srun and sbatch set them on
// Slurm 22.05): only srun without PMIx is refused, naming the fix.
TEST(MpiStart, SrunWithoutPmixIsRefusedNamingTheFix) {
  using Env = std::map<std::string, std::string>;
  auto refusal = [](const Env& vars) {
    return launch::mpi_start_refusal([&](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_EQ(refusal({}), "");  // a plain process: a singleton
  EXPECT_EQ(refusal({{"SLURM_JOB_ID", "7"}, {"SLURM_PROCID", "0"}}), "");  // a batch script
  const Env srun_task = {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}};
  Env pmix = srun_task;
  pmix.insert({{"SLURM_MPI_TYPE", "pmix"}, {"PMIX_RANK", "1"}});
  EXPECT_EQ(refusal(pmix), "");
  Env under_mpirun = srun_task;  // mpirun started inside an srun step
  under_mpirun["OMPI_COMM_WORLD_RANK"] = "3";
  EXPECT_EQ(refusal(under_mpirun), "");
  const std::string none = refusal(srun_task);
  EXPECT_NE(none.find("SLURM_MPI_TYPE unset: srun --mpi=none"), std::string::npos) << none;
  EXPECT_NE(none.find("srun --mpi=pmix"), std::string::npos) << none;
  Env pmi2 = srun_task;  // an Open MPI with Slurm's PMI-2 client may start here
  pmi2.insert({{"SLURM_MPI_TYPE", "pmi2"}, {"PMI_FD", "5"}});
  EXPECT_EQ(refusal(pmi2), "");
}

// Only a process no launcher started gets the singleton's quick start (no daemon, no
// network transports): ranks of mpirun, srun with PMIx or PMI-2, or hydra keep theirs.
TEST(MpiStart, SingletonOnlyWithoutALauncher) {
  using Env = std::map<std::string, std::string>;
  auto singleton = [](const Env& vars) {
    return launch::mpi_singleton([&](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_TRUE(singleton({}));
  EXPECT_TRUE(singleton({{"SLURM_JOB_ID", "7"}, {"SLURM_PROCID", "0"}}));  // a batch script
  EXPECT_FALSE(singleton({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "1"}}));
  EXPECT_FALSE(singleton({{"SLURM_STEP_ID", "0"}, {"PMIX_RANK", "1"}}));
  EXPECT_FALSE(singleton({{"PMI_RANK", "2"}}));
  EXPECT_FALSE(singleton({{"SLURM_STEP_ID", "0"}, {"PMI_FD", "5"}}));
}

TEST(ComputeThreads, ExplicitCountOrTheCoresSharedAmongTheRanks) {
  // The CPUs this process may use: its affinity mask, or fewer where its cgroup says so.
  const int cores = cgroup_cpus(omp_get_num_procs()).cpus;
  EXPECT_EQ(launch::set_compute_threads(3), "threads: 3 (train.threads)");
  EXPECT_EQ(omp_get_max_threads(), 3);
  launch::set_compute_threads(0, 1);
  EXPECT_EQ(omp_get_max_threads(), cores);
  launch::set_compute_threads(0, 2);
  EXPECT_EQ(omp_get_max_threads(), std::max(1, cores / 2));
  launch::set_compute_threads(0, 4 * cores);  // more ranks than cores: one thread each
  EXPECT_EQ(omp_get_max_threads(), 1);
}

// A cgroup's CPU quota bounds the threads (a fake tree under PENTAD_CGROUP_ROOT): 1.5 CPUs
// are 2 threads, shared among the ranks of the machine, and the line says so.
TEST(ComputeThreads, TheCgroupQuotaBoundsThem) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("pentad_rank_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "proc/self");
  std::filesystem::create_directories(root / "sys/fs/cgroup/job");
  std::ofstream(root / "proc/self/cgroup") << "0::/job\n";
  std::ofstream(root / "sys/fs/cgroup/job/cpu.max") << "150000 100000\n";
  setenv("PENTAD_CGROUP_ROOT", root.c_str(), 1);
  const int procs = omp_get_num_procs();
  const std::string line = launch::set_compute_threads(0, 1);
  EXPECT_EQ(omp_get_max_threads(), std::min(2, procs));
  const std::string shared = launch::set_compute_threads(0, 2);
  EXPECT_EQ(omp_get_max_threads(), 1);
  if (procs > 2) {  // else the affinity mask decides, and the lines name it
    EXPECT_EQ(line, "threads: 2 from cgroup /job (cpu.max 150000 100000 = 1.5 CPUs, rounded up)");
    EXPECT_EQ(shared,
              "threads: 1 a rank, 2 CPUs from cgroup /job (cpu.max 150000 100000 = 1.5 CPUs, "
              "rounded up) shared by 2 ranks on this machine");
  }
  unsetenv("PENTAD_CGROUP_ROOT");
  std::filesystem::remove_all(root);
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
