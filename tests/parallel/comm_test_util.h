#pragma once
// What the sources of the communicator's tests share (comm_test.cpp: the collectives and the
// injected slowness; comm_trace_test.cpp: point-to-point, non-blocking work and the trace;
// comm_routing_test.cpp: the refusals and the host/device routing): host tensors over
// vectors, the fixture with the world's MPI communicator, and the trace's events by name.
// Each source is its own ctest entry of parallel_tests (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace pentad::parallel::comm_test_util {

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}

template <typename T>
Tensor view(std::vector<T>& v) {
  Tensor t;
  t.data = v.data();
  t.dtype = dtype_of<T>();
  t.shape = Shape{int64_t(v.size())};
  return t;
}

class CommTest : public testing::Test {
 protected:
  void SetUp() override {
    comm = make_communicator(Backend::MPI, MPI_COMM_WORLD, "test");
    r = comm->rank();
    n = comm->size();
    if (n < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
  }
  std::unique_ptr<Communicator> comm;
  int r = 0, n = 1;
};

// Newest events of communicator `name`, oldest first.
inline std::vector<CommEvent> events_of(const std::string& name) {
  std::vector<CommEvent> out;
  for (const CommEvent& e : comm_events())
    if (e.name() == name) out.push_back(e);
  return out;
}

}  // namespace pentad::parallel::comm_test_util
