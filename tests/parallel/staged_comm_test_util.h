#pragma once
// What the staged communicator's test programs share (staged_comm_test.cpp: every operation
// in every dtype bitwise against MPI; staged_backend_test.cpp: rings, operations in flight,
// the trace, the choice of backend and a training run): the world's ranks, and the fixture
// with a staged and an MPI communicator over the world.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "parallel/comm.h"
#include "tests/parallel/mpi_test_util.h"

namespace pentad::parallel::staged_comm_test_util {

using mpi_test::world_rank;
using mpi_test::world_size;

class StagedComm : public testing::Test {
 protected:
  void SetUp() override {
    if (world_size() < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
    staged = make_communicator(Backend::Staged, MPI_COMM_WORLD, "staged");
    mpi = make_communicator(Backend::MPI, MPI_COMM_WORLD, "mpi");
  }
  std::unique_ptr<Communicator> staged, mpi;
};

}  // namespace pentad::parallel::staged_comm_test_util
