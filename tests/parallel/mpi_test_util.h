#pragma once
// What the MPI test programs' sources share (parallel_tests compiles several files as one
// source, so each name here is defined once; the CUDA ones use it too): the world's rank and
// size.
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
