#pragma once
// Start-up of one rank, before its mesh and its Trainer exist: how many compute threads it
// runs, where it sits among the ranks sharing its machine, and which device it computes
// on. `pentad train` (launch/train_command.cpp) calls start_rank() first thing; tests that build a
// Trainer the way the executable does call it too.
#include <cstdint>
#include <functional>
#include <string>

#include "parallel/comm.h"
#include "recipe/config.h"

namespace pentad::launch {

// Why MPI cannot start in this process, from its environment (`env` looks a variable up:
// std::getenv in the executable, a table in tests), or "" when nothing stands in the way.
// One case: a task that srun started without a process-management interface (srun
// --mpi=none, or a slurm.conf without MpiDefault=pmix). Open MPI cannot join such a task to
// the others, nor run it alone, and aborts in MPI_Init saying only "Local abort before
// MPI_INIT completed"; the refusal names the fix instead. A batch script's own shell (no
// SLURM_STEP_ID) and mpirun's ranks (OMPI_COMM_WORLD_RANK) start as usual.
std::string mpi_start_refusal(const std::function<const char*(const char*)>& env);

// Whether this process starts MPI alone (a singleton: no launcher's variables; `env` as
// above). Open MPI then spends about 0.35 s of each start on a daemon no singleton of ours
// uses (pentad never spawns) and on probing network transports it has no peer for.
bool mpi_singleton(const std::function<const char*(const char*)>& env);
// For a singleton, before MPI_Init: no daemon, no session directory, and the one transport a
// lone process needs (self); a start takes 0.15 s instead of 0.5. Variables the user set are
// kept.
void prepare_singleton_start();

// This rank's place among the ranks sharing its machine (its cores and GPUs). From MPI, never
// from a launcher's environment (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID): the same under
// mpirun and srun, or any launcher that starts an MPI job (docs/launching.md).
struct NodePlace {
  int rank = 0;  // local rank
  int size = 1;  // ranks on this machine
};
// Collective over MPI_COMM_WORLD; {0, 1} when MPI is not initialised.
NodePlace node_place();

// Sets the number of compute threads for OpenMP and OpenBLAS: `threads`, or when 0 the CPUs
// this process may use shared evenly among the ranks running on its machine (at least one
// each). Those CPUs are the fewest of its affinity mask, its cgroup's cpuset and its
// cgroup's CPU quota rounded up (core/cgroup.h). Returns the count and what decided it, as
// a line for the log: "threads: 2 from cgroup /x (cpu.max 150000 100000 = 1.5 CPUs,
// rounded up)".
std::string set_compute_threads(int64_t threads, int ranks_on_node = 1);

// For train.device = "cuda": makes this rank's GPU current (its local rank modulo the
// visible devices) and returns the backend the mesh's communicators need: NCCL (host
// tensors on them travel by MPI), or the staged backend where two ranks share a GPU, NCCL
// is not built or parallel.comm_backend asks for it (parallel/backend_choice.h). MPI for the
// CPU unless parallel.comm_backend = "staged". Throws pentad::Error when no GPU is visible.
// Call before creating the mesh. Collective over MPI_COMM_WORLD for "cuda".
parallel::Backend select_device(const Config& cfg);

// Both of the above for the recipe's train.threads and train.device, the ranks on this
// machine sharing its cores (the first of them logs how many threads each takes when
// train.threads = 0): returns the backend for the mesh. Collective over MPI_COMM_WORLD when
// MPI is initialised.
parallel::Backend start_rank(const Config& cfg);

}  // namespace pentad::launch
