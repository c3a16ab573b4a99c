#pragma once
// Which communicator backend a job takes (parallel/comm.h): the recipe's
// parallel.comm_backend and where the ranks are.
//   CPU runs: MPI; "staged" forces the staged backend on host tensors (every collective
//     copies through host staging: its logic, tested on the CPU); "nccl" is refused.
//   CUDA runs, "auto": NCCL where every rank has a GPU of its own; the staged backend where
//     two ranks share one (NCCL takes one GPU per rank: its communicator fails to start), or
//     where this pentad was built without NCCL. "nccl" and "staged" force either, "nccl"
//     refused where it cannot run.
// One backend for every group of the mesh: the world group holds every rank, so two ranks
// on one GPU put it in the staged backend anyway.
#include <mpi.h>

#include <span>
#include <string>
#include <string_view>

#include "parallel/comm.h"

namespace pentad::parallel {

// Where a rank computes: its machine, and its GPU's PCI bus id there ("" on the CPU).
struct RankPlace {
  std::string host;
  std::string gpu;
};

struct BackendChoice {
  Backend backend = Backend::MPI;
  std::string reason;  // why, for the log line ("" for the CPU's plain MPI)
};

// The pure decision: places[r] is world rank r's place. Throws pentad::Error naming
// parallel.comm_backend for a value other than "auto", "nccl" or "staged", and for "nccl"
// where it cannot run (a CPU run, a build without NCCL, two ranks on one GPU).
BackendChoice choose_backend(std::string_view requested, bool on_gpu, bool nccl_built,
                             std::span<const RankPlace> places);

// The same for this job: on a GPU, gathers every rank's place over `world` (collective: call
// on every rank, after the rank's GPU is made current), and rank 0 logs the choice and why.
// `gpu` is this rank's PCI bus id; a CPU run gathers nothing. MPI need not be initialised
// (one rank).
Backend select_backend(std::string_view requested, bool on_gpu, const std::string& gpu,
                       MPI_Comm world);

}  // namespace pentad::parallel
