// The expert-parallel dispatcher (parallel/ep/expert_parallel.h) on device rows through
// NCCL against the same dispatcher on host rows through MPI: the same uneven counts, the
// same tagged rows, bitwise the same dispatched rows and combined outputs. ep is the world
// (one rank under ctest, where the all-to-all goes to itself and the regrouping is still
// device staging, zeros and copies; every rank with one GPU each under mpirun), etp one
// rank. A warm round (the sizes of the round before) must not make the host wait: the
// counts travel over MPI, the rows stay on the device. The same with bf16 rows.
//
// Part of nccl_comm_test (its main() initialises MPI). Without a CUDA device it skips.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "core/device_memory.h"
#include "parallel/comm.h"
#include "parallel/ep/expert_parallel.h"

namespace pentad::parallel {
namespace {

constexpr int64_t kExperts = 4, kWidth = 5;

int ranks() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Device memory of one round, one arena per tensor (the poison shows an unwritten row).
// T: float (f32 rows) or uint16_t (bf16 rows, as host code holds them).
template <typename T>
struct DeviceRows {
  Arena arena;
  Tensor rows;
  DeviceRows(int64_t n, DType dtype, const std::vector<T>* values)
      : arena("ep test", size_t(std::max<int64_t>(n, 1) * kWidth) * sizeof(T), Device::CUDA) {
    rows = arena.alloc(Shape{n, kWidth}, dtype);
    device_fill_ones(rows.data, rows.bytes());
    if (values) copy_bytes(rows.data, Device::CUDA, values->data(), Device::CPU, rows.bytes());
  }
  std::vector<T> host() const {
    std::vector<T> out(size_t(rows.numel()));
    copy_bytes(out.data(), Device::CPU, rows.data, Device::CUDA, rows.bytes());
    return out;
  }
};

// Rows of dtype (T as DeviceRows), element n of rank r's round i being value(r * 1000 + i * 100 +
// n): every element distinct.
template <typename T, typename Value>
void check_device_against_host(DType dtype, Value value) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (cuda_device_count() < ranks())
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << ranks() << " ranks";
  if (kExperts % ranks() != 0) GTEST_SKIP() << kExperts << " experts over " << ranks() << " ranks";
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  select_cuda_device(me);
  auto host_ep = make_communicator(Backend::MPI, MPI_COMM_WORLD, "ep host");
  auto host_etp = make_communicator(Backend::MPI, MPI_COMM_SELF, "etp host");
  auto device_ep = make_communicator(Backend::NCCL, MPI_COMM_WORLD, "ep");
  auto device_etp = make_communicator(Backend::NCCL, MPI_COMM_SELF, "etp");
  ExpertParallel on_host(*host_ep, *host_etp, kExperts);
  ExpertParallel on_device(*device_ep, *device_etp, kExperts);

  // Round 0 small, round 1 larger (the staging grows), round 2 as round 1 (warm).
  for (int round = 0; round < 3; ++round) {
    const int size_round = round == 2 ? 1 : round;
    std::vector<int64_t> send(kExperts);
    for (int64_t e = 0; e < kExperts; ++e)
      send[size_t(e)] = (me + e + size_round) % 3 + 2 * size_round;  // uneven, zeros in round 0
    const int64_t A = std::accumulate(send.begin(), send.end(), int64_t{0});
    std::vector<T> in(size_t(A * kWidth));
    for (size_t n = 0; n < in.size(); ++n)
      in[n] = value(int64_t(me * 1000 + round * 100) + int64_t(n));

    const std::vector<int64_t> counts = on_host.exchange_counts(send);
    ASSERT_EQ(on_device.exchange_counts(send), counts) << "round " << round;
    const std::vector<int64_t> rows = on_host.expert_rows(counts);
    const int64_t R = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    std::vector<T> out(size_t(R * kWidth)), back(size_t(A * kWidth));
    on_host.dispatch(send, counts, view_of(in.data(), Shape{A, kWidth}, dtype),
                     view_of(out.data(), Shape{R, kWidth}, dtype));
    on_host.combine(send, counts, view_of(out.data(), Shape{R, kWidth}, dtype),
                    view_of(back.data(), Shape{A, kWidth}, dtype));
    ASSERT_EQ(back, in) << "round " << round << ": the host round trip (etp 1) is exact";

    DeviceRows<T> d_in(A, dtype, &in), d_out(R, dtype, nullptr), d_back(A, dtype, nullptr);
    const int64_t waits = device_waits();
    on_device.dispatch(send, counts, d_in.rows, d_out.rows);
    on_device.combine(send, counts, d_out.rows, d_back.rows);
    if (round == 2) {
      EXPECT_EQ(device_waits(), waits) << "a warm dispatch and combine made the host wait";
    }
    EXPECT_EQ(d_out.host(), out) << "round " << round << ": dispatched rows";
    EXPECT_EQ(d_back.host(), in) << "round " << round << ": combined rows";
  }
  device_ep->barrier();
}

TEST(NcclExpertParallel, DeviceRowsMatchHostRowsWithoutHostWaits) {
  check_device_against_host<float>(DType::F32, [](int64_t v) { return float(v); });
}

// bf16 rows (2 bytes an element) through NCCL's all-to-all and the device staging, word for
// word as MPI moves them on the host. The words are the values themselves (finite bf16
// below 0x7f80), distinct where rounded floats would collide.
TEST(NcclExpertParallel, Bf16DeviceRowsMatchHostRows) {
  check_device_against_host<uint16_t>(DType::BF16, [](int64_t v) { return uint16_t(v); });
}

}  // namespace
}  // namespace pentad::parallel
