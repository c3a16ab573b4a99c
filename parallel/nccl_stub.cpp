// Linked instead of nccl_comm.cpp when CMake found no CUDA or no NCCL.
#include "core/check.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {

bool nccl_compiled() {
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, std::string name) {
  fail(
      "communicator '{}': this pentad was built without NCCL (CMake found no CUDA toolkit "
      "or no nccl.h/libnccl); use the MPI backend or rebuild on a machine with CUDA and NCCL",
      name);
}

}  // namespace pentad::parallel
