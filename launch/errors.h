#pragma once
// MPI's start and end for the `pentad` executable, and how its ranks agree on an error before
// they report it: once for the job where every rank has the same, once per rank where only
// some have it (exit statuses: cli/command.h).
#include <mpi.h>

#include <exception>
#include <functional>

#include "cli/command.h"

namespace pentad::launch {

// MPI for the process's lifetime, with a communicator kept for agreeing on errors alone.
struct Mpi {
  int rank = 0, size = 1;
  MPI_Comm errors = MPI_COMM_NULL;  // the ranks' agreement on an error alone (report_error)
  Mpi(int& argc, char**& argv);
  ~Mpi();
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
  // What a command's action gets: this rank, and on_every_rank below.
  cli::Job job() const;
};

// Where every rank stands at the same point, none inside a collective (the steps before the
// mesh: reading the recipe, the layout, the memory check), runs `step` and has the ranks
// agree on an error before any of them reports it. Returns 0 when no rank has one; else every
// rank returns the job's status after the error is printed once (or once per rank that has
// it), and the ranks end through MPI_Finalize: no MPI_Abort, whose boilerplate would bury the
// message.
int on_every_rank(int rank, int size, const std::function<void()>& step);

// An error where the other ranks may be inside a collective (building or running the
// trainer). This rank waits up to `seconds` for the others to report an error too, through
// a non-blocking all-reduce on job.errors (kept for this alone), so that an error every rank
// meets is printed once; then `tell` (the supervisor) and, in a multi-rank job, MPI_Abort
// ends them all (a rank may be waiting on this one). Returns the status of a single rank.
int report_error(const std::exception& e, int status, const cli::Job& job,
                 const std::function<void()>& tell = {}, double seconds = 1.0);

}  // namespace pentad::launch
