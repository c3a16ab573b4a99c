#include "launch/rank.h"

#include <mpi.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "core/cgroup.h"
#include "core/device_memory.h"
#include "kernels/cpu/blas_core.h"
#include "parallel/backend_choice.h"
#include "parallel/trace.h"
#include "plan/layout.h"

namespace pentad::launch {

bool mpi_singleton(const std::function<const char*(const char*)>& env) {
  // mpirun's ranks, PMIx (srun --mpi=pmix, prterun, mpirun's own server), PMI-1/2 (MPICH's
  // hydra, srun --mpi=pmi2).
  for (const char* wired : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PMI_FD"})
    if (env(wired)) return false;
  return true;
}

std::string mpi_start_refusal(const std::function<const char*(const char*)>& env) {
  if (!env("SLURM_STEP_ID")) return "";  // not a task of srun
  // Wired to the others by PMIx, mpirun or PMI-2 (srun --mpi=pmi2, which an Open MPI built
  // with Slurm's PMI-2 can use).
  if (!mpi_singleton(env)) return "";
  const char* mpi_type = env("SLURM_MPI_TYPE");
  return fmt::format(
      "srun started this task without PMIx (SLURM_MPI_TYPE {}), so MPI cannot start in it: "
      "run srun --mpi=pmix ..., or set MpiDefault=pmix in slurm.conf (docs/launching.md)",
      mpi_type ? fmt::format("= {}", mpi_type) : std::string("unset: srun --mpi=none"));
}

void prepare_singleton_start() {
  if (!mpi_singleton(std::getenv)) return;
  setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
  // Isolated singletons all take job id [0,1], so their session directories would be one
  // (/tmp/ompi.<host>.<uid>/jf.0/1): one exiting removed it while another was creating it
  // ("orte_session_dir failed"). A lone process needs none.
  setenv("OMPI_MCA_orte_create_session_dirs", "0", 0);
  setenv("OMPI_MCA_pml", "ob1", 0);
  setenv("OMPI_MCA_btl", "self", 0);
}

NodePlace node_place() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return {};
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodePlace place;
  MPI_Comm_rank(node, &place.rank);
  MPI_Comm_size(node, &place.size);
  MPI_Comm_free(&node);
  return place;
}

std::string set_compute_threads(int64_t threads, int ranks_on_node) {
  if (threads > 0) {
    omp_set_num_threads(static_cast<int>(threads));
    return fmt::format("threads: {} (train.threads)", threads);
  }
  // A job's cgroup may allow fewer CPUs than the affinity mask shows (a CPU quota, as
  // docker --cpus and Kubernetes limits set): more threads than that only wait their turn.
  const CgroupCpus cpus = cgroup_cpus(omp_get_num_procs());
  const int ranks = std::max(1, ranks_on_node);
  const int n = std::max(1, cpus.cpus / ranks);
  omp_set_num_threads(n);
  if (ranks == 1) return fmt::format("threads: {} from {}", n, cpus.source);
  return fmt::format("threads: {} a rank, {} CPU{} from {} shared by {} ranks on this machine", n,
                     cpus.cpus, cpus.cpus == 1 ? "" : "s", cpus.source, ranks);
}

parallel::Backend select_device(const Config& cfg) {
  const bool on_gpu = placement(cfg).device == Device::CUDA;
  if (on_gpu) select_cuda_device(node_place().rank);
  return parallel::select_backend(cfg.parallel.comm_backend, on_gpu,
                                  on_gpu ? cuda_device_pci_bus_id() : "", MPI_COMM_WORLD);
}

parallel::Backend start_rank(const Config& cfg) {
  const NodePlace place = node_place();
  parallel::align_trace_clock(MPI_COMM_WORLD);  // one clock for the timeline's ranks
  const std::string threads = set_compute_threads(cfg.train.threads, place.size);
  if (place.rank == 0) {
    spdlog::info("{}", threads);
    if (const std::string blas = kernels::cpu::blas_core_note(); !blas.empty())
      spdlog::info("{}", blas);
  }
  return select_device(cfg);
}

}  // namespace pentad::launch
