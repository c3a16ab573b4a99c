// main() of the MPI test programs (run under mpirun; alone they run as one rank). Every
// rank runs every test; rank 0 prints the usual report, the other ranks print only their
// failures, and after each test rank 0 names the ranks on which it failed. The process
// fails if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "kernels/cpu/blas_core.h"
#include "launch/rank.h"

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// On ranks other than 0: the failed assertions, prefixed with the rank.
class FailurePrinter : public testing::EmptyTestEventListener {
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", world_rank(),
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
  }
};

// On every rank: after each test, rank 0 learns which ranks failed it.
class RankVerdicts : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int failed = info.result()->Failed() ? 1 : 0;
    std::string flags(size_t(size), '\0');
    char mine = char(failed);
    MPI_Gather(&mine, 1, MPI_CHAR, flags.data(), 1, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (world_rank() != 0) return;
    std::string ranks;
    for (int r = 0; r < size; ++r)
      if (flags[size_t(r)]) {
        if (!ranks.empty()) ranks += ' ';
        ranks += std::to_string(r);
      }
    if (!ranks.empty())
      std::fprintf(stderr, "%s.%s failed on rank(s) %s of %d\n", info.test_suite_name(),
                   info.name(), ranks.c_str(), size);
  }
};

}  // namespace

int main(int argc, char** argv) {
  pentad::kernels::cpu::restart_with_better_blas_core(argv);  // as the executable does
  pentad::launch::prepare_singleton_start();  // as the executable does (one rank, no mpirun)
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  testing::InitGoogleTest(&argc, argv);
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (world_rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
  }
  listeners.Append(new RankVerdicts);
  const int local = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any != 0 ? 1 : 0;
}
