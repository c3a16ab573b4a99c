#pragma once
// What the backends share with comm.cpp; callers include parallel/comm.h only.
#include <mpi.h>

#include <memory>
#include <string>

namespace pentad::parallel {

class Communicator;

// One posted operation. test() never blocks; wait() blocks. Both throw pentad::Error
// (after dumping the trace) if the operation failed.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// Dumps this rank's communication trace to stderr, then throws pentad::Error(message):
// the reaction to any error reported by MPI or NCCL.
[[noreturn]] void fail_with_trace(const std::string& message);

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name);
// Defined by nccl_comm.cpp in builds with CUDA and NCCL, else by nccl_stub.cpp.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name);
bool nccl_compiled();

}  // namespace pentad::parallel
