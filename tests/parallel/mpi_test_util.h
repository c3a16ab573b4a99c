#pragma once
// What every MPI test program's sources share (they are compiled as one source, so each name
// here is defined once): the world's rank and size.
#include <mpi.h>

namespace pentad::mpi_test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace pentad::mpi_test
