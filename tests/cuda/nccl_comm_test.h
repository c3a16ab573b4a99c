#pragma once
// What the sources of nccl_comm_test share (nccl_comm_test.cpp: the collectives and host
// routing; nccl_comm_streams_test.cpp: the stream rule and pipeline rounds): device tensors
// of doubles, the ranks of MPI_COMM_WORLD, the backend under test, and the fixture that
// builds its communicator.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "parallel/comm.h"
#include "tests/parallel/mpi_test_util.h"

// A named namespace, not an anonymous one: the fixture must be one type in every source.
namespace pentad::parallel::nccl_comm_test {

// Owns the device memory of one test; one arena per tensor.
class Gpu {
 public:
  Tensor alloc(int64_t n, DType dtype) {
    const size_t bytes = size_t(n) * dtype_bytes(dtype);
    arenas_.emplace_back("nccl test", std::max<size_t>(bytes, 1), Device::CUDA);
    return arenas_.back().alloc(Shape{n}, dtype);
  }
  // 0xff bytes: NaN in F32, F64 and BF16, -1 in I32.
  Tensor poisoned(int64_t n, DType dtype) {
    Tensor t = alloc(n, dtype);
    device_fill_ones(t.data, t.bytes());
    return t;
  }
  Tensor upload(const std::vector<double>& values, DType dtype) {
    Tensor t = alloc(int64_t(values.size()), dtype);
    std::vector<char> bytes(t.bytes());
    for (size_t i = 0; i < values.size(); ++i) {
      const double v = values[i];
      char* at = bytes.data() + i * dtype_bytes(dtype);
      if (dtype == DType::F32) {
        const float f = float(v);
        std::memcpy(at, &f, sizeof f);
      } else if (dtype == DType::F64) {
        std::memcpy(at, &v, sizeof v);
      } else if (dtype == DType::I32) {
        const int32_t x = int32_t(v);
        std::memcpy(at, &x, sizeof x);
      } else {
        const uint16_t b = float_to_bf16(float(v));
        std::memcpy(at, &b, sizeof b);
      }
    }
    copy_bytes(t.data, Device::CUDA, bytes.data(), Device::CPU, t.bytes());
    return t;
  }

 private:
  std::deque<Arena> arenas_;
};

// Every element as a double (exact for the small integers these tests use).
inline std::vector<double> download(const Tensor& t) {
  std::vector<char> bytes(t.bytes());
  copy_bytes(bytes.data(), Device::CPU, t.data, Device::CUDA, t.bytes());
  std::vector<double> values(size_t(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    const char* at = bytes.data() + i * dtype_bytes(t.dtype);
    if (t.dtype == DType::F32) {
      float f;
      std::memcpy(&f, at, sizeof f);
      values[i] = f;
    } else if (t.dtype == DType::F64) {
      std::memcpy(&values[i], at, sizeof(double));
    } else if (t.dtype == DType::I32) {
      int32_t x;
      std::memcpy(&x, at, sizeof x);
      values[i] = x;
    } else {
      uint16_t b;
      std::memcpy(&b, at, sizeof b);
      values[i] = bf16_to_float(b);
    }
  }
  return values;
}

inline std::vector<CommEvent> events_of(const std::string& name) {
  std::vector<CommEvent> out;
  for (const CommEvent& e : comm_events())
    if (e.name() == name) out.push_back(e);
  return out;
}

using mpi_test::world_rank;
using mpi_test::world_size;

// NCCL, or the staged backend where PENTAD_COMM_TEST_BACKEND=staged.
inline Backend tested_backend() {
  const char* backend = std::getenv("PENTAD_COMM_TEST_BACKEND");
  return backend && std::string(backend) == "staged" ? Backend::Staged : Backend::NCCL;
}

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    if (tested_backend() == Backend::NCCL && cuda_device_count() < world_size())
      GTEST_SKIP() << "NCCL needs one GPU per rank: " << world_size() << " ranks, "
                   << cuda_device_count() << " GPUs";
    ASSERT_TRUE(backend_available(Backend::NCCL)) << "a CUDA build without NCCL";
    select_cuda_device(world_rank());  // modulo the GPUs: the staged backend shares them
    comm = make_communicator(tested_backend(), MPI_COMM_WORLD, "nccl");
    r = comm->rank();
    n = comm->size();
  }
  void TearDown() override {
    if (comm) comm->barrier();  // every queued operation done before the memory goes
  }
  Gpu gpu;  // declared first: freed after the communicator's last operation
  std::unique_ptr<Communicator> comm;
  int r = 0, n = 1;
};

}  // namespace pentad::parallel::nccl_comm_test
