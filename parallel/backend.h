#pragma once
// What the backends share with comm.cpp; callers include parallel/comm.h only.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace pentad::parallel {

class Communicator;

struct TraceTicket;

// One posted operation. test() never blocks. wait() blocks until the operation is complete
// for the caller: for host memory until it is done, for device memory until later work on
// the compute stream is ordered after it (comm.h, "Stream rule"). Both throw pentad::Error
// (after dumping the trace) if the operation failed.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
  // Called once, after wait(). true: the host has not seen the operation done yet, and the
  // backend keeps the ticket to stamp the trace's leave time when it does. false (MPI):
  // the host saw it done, and the caller stamps the leave time now.
  virtual bool keep_ticket(const TraceTicket&) { return false; }
};

// Dumps this rank's communication trace to stderr, then throws pentad::Error(message):
// the reaction to any error reported by MPI or NCCL.
[[noreturn]] void fail_with_trace(const std::string& message);

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name);
std::unique_ptr<Communicator> make_staged_communicator(MPI_Comm comm, std::string name);
// The world ranks of comm's ranks, in its rank order. Collective-free.
std::vector<int> world_ranks_of(MPI_Comm comm);
// Defined by nccl_comm.cpp in builds with CUDA and NCCL, else by nccl_stub.cpp.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name);
bool nccl_compiled();

}  // namespace pentad::parallel
