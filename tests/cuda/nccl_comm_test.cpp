// The NCCL communicator on device tensors, host tensors on the same communicator (routed
// to its MPI companion), and the stream rule of parallel/comm.h: kernels on the compute
// stream, communication on the communicator's own stream, ordered by events only.
//
// Written for any number of ranks with one GPU each, up to 7 (rank r contributes values
// like r*10 + i, which bf16 holds exactly; the closed forms are next to the checks). ctest
// runs it as one rank, which NCCL supports, so every collective runs (send/recv to self
// included), though a one-rank reduction gives back its input. The ordering tests need no
// second rank: a one-rank all-gather is a device copy from in to out on the communication
// stream, which races with the kernels around it unless the events order them.
//
// Without a CUDA device every test skips with "no CUDA device", and ctest reports it as
// skipped (tests/cuda/CMakeLists.txt); scripts/gpu_test.sh fails on a skip.
//
// PENTAD_COMM_TEST_BACKEND=staged runs the fixture's tests on the staged communicator
// (parallel/staged_comm.cpp: device tensors through page-locked host staging and MPI) with
// any number of ranks sharing the GPUs; ctest runs the collectives and the ordering test so
// at 2 and 4 ranks on one GPU (label gpu_multi). The tests of NCCL's own behaviour (a wait
// that leaves the host free, host routing to the companion, the memory check, the pipeline
// rounds on one rank) are NCCL's only.
//
// This source: the collectives on every dtype and the routing of host tensors;
// nccl_comm_streams_test.cpp: the stream rule and pipeline rounds (what both share:
// nccl_comm_test.h).
#include "tests/cuda/nccl_comm_test.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "parallel/comm.h"

namespace pentad {

// How gtest (and so the ctest names) print the dtype parameter.
void PrintTo(DType dtype, std::ostream* os) {
  *os << dtype_name(dtype);
}

}  // namespace pentad

namespace pentad::parallel::nccl_comm_test {
namespace {

class NcclCollective : public NcclComm, public testing::WithParamInterface<DType> {};

TEST_P(NcclCollective, AllReduceSumMaxMin) {
  const DType dtype = GetParam();
  const int k = 5;
  std::vector<double> mine(k);
  for (int i = 0; i < k; ++i) mine[size_t(i)] = r * 10 + i;
  Tensor sum = gpu.upload(mine, dtype), max = gpu.upload(mine, dtype),
         min = gpu.upload(mine, dtype);
  comm->all_reduce(sum, ReduceOp::Sum);
  comm->all_reduce(max, ReduceOp::Max, /*async=*/true).wait();
  Work pending = comm->all_reduce(min, ReduceOp::Min, /*async=*/true);
  pending.wait();
  const std::vector<double> s = download(sum), hi = download(max), lo = download(min);
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(s[size_t(i)], 10.0 * n * (n - 1) / 2 + n * i) << i;  // sum_r (10r + i)
    EXPECT_EQ(hi[size_t(i)], 10.0 * (n - 1) + i) << i;
    EXPECT_EQ(lo[size_t(i)], double(i)) << i;
  }
}

TEST_P(NcclCollective, ReduceScatterAllGatherBroadcast) {
  const DType dtype = GetParam();
  const int k = 3;
  std::vector<double> in(size_t(n * k));
  for (int j = 0; j < n * k; ++j) in[size_t(j)] = r + j;
  Tensor out = gpu.poisoned(k, dtype);
  comm->reduce_scatter(out, gpu.upload(in, dtype));
  std::vector<double> got = download(out);
  for (int i = 0; i < k; ++i)  // sum_q (q + r*k + i)
    EXPECT_EQ(got[size_t(i)], n * (n - 1) / 2.0 + n * (r * k + i)) << i;

  std::vector<double> mine(k);
  for (int i = 0; i < k; ++i) mine[size_t(i)] = r * 10 + i;
  Tensor all = gpu.poisoned(n * k, dtype);
  comm->all_gather(all, gpu.upload(mine, dtype));
  got = download(all);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < k; ++i) EXPECT_EQ(got[size_t(q * k + i)], q * 10 + i) << q << " " << i;

  const int root = n - 1;
  Tensor buf = gpu.upload(std::vector<double>(k, r == root ? 7.0 : -3.0), dtype);
  comm->broadcast(buf, root);
  for (double v : download(buf)) EXPECT_EQ(v, 7.0);
}

// ZeRO's uneven blocks (rank q holds q + 1 elements; rank 1 none when there are more than
// two): grouped ncclReduce and ncclBroadcast calls, against the same sums as MPI's.
TEST_P(NcclCollective, UnevenReduceScatterAndAllGather) {
  const DType dtype = GetParam();
  std::vector<int64_t> counts(static_cast<size_t>(n));
  int64_t total = 0, mine = 0;
  for (int q = 0; q < n; ++q) {
    counts[size_t(q)] = (n > 2 && q == 1) ? 0 : q + 1;
    if (q == r) mine = total;
    total += counts[size_t(q)];
  }
  std::vector<double> in(static_cast<size_t>(total));
  for (int64_t j = 0; j < total; ++j) in[size_t(j)] = r + j;
  const int64_t k = counts[size_t(r)];
  Tensor out = gpu.poisoned(std::max<int64_t>(k, 1), dtype);
  comm->reduce_scatter_v(out, gpu.upload(in, dtype), counts);
  const std::vector<double> got = download(out);
  for (int64_t i = 0; i < k; ++i)  // sum_q (q + mine + i)
    EXPECT_EQ(got[size_t(i)], n * (n - 1) / 2.0 + n * double(mine + i)) << i;

  std::vector<double> buf(static_cast<size_t>(total), -1.0);
  for (int64_t i = 0; i < k; ++i) buf[size_t(mine + i)] = r * 10 + double(i);
  Tensor all = gpu.upload(buf, dtype);
  comm->all_gather_v(all, counts);
  const std::vector<double> whole = download(all);
  int64_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i, ++at)
      EXPECT_EQ(whole[size_t(at)], q * 10 + double(i)) << q << " " << i;
}

TEST_P(NcclCollective, AllToAllAndSendRecvAroundARing) {
  const DType dtype = GetParam();
  const int k = 2;
  std::vector<double> in(size_t(n * k));
  for (int p = 0; p < n; ++p)  // block p goes to rank p
    for (int i = 0; i < k; ++i) in[size_t(p * k + i)] = r * 20 + p * 4 + i;
  Tensor out = gpu.poisoned(n * k, dtype);
  comm->all_to_all(out, gpu.upload(in, dtype));
  std::vector<double> got = download(out);
  for (int q = 0; q < n; ++q)  // block q came from rank q
    for (int i = 0; i < k; ++i) EXPECT_EQ(got[size_t(q * k + i)], q * 20 + r * 4 + i);

  // Uneven: rank r sends 1 + (r + p) % 2 elements to rank p; the tail stays poisoned.
  std::vector<int64_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
  std::vector<double> send;
  for (int p = 0; p < n; ++p) {
    send_counts[size_t(p)] = 1 + (r + p) % 2;
    recv_counts[size_t(p)] = 1 + (p + r) % 2;
    for (int i = 0; i < send_counts[size_t(p)]; ++i) send.push_back(r * 20 + p * 4 + i);
  }
  Tensor recv = gpu.poisoned(2 * n + 1, dtype);
  comm->all_to_all_v(recv, recv_counts, gpu.upload(send, dtype), send_counts);
  got = download(recv);
  size_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (int i = 0; i < recv_counts[size_t(q)]; ++i) {
      EXPECT_EQ(got[at], q * 20 + r * 4 + i) << q << " " << i;
      ++at;
    }
  }
  if (dtype != DType::I32) {
    EXPECT_TRUE(std::isnan(got.back()));
  }

  // Send right, receive from the left, in one batch (one rank: to itself).
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  Tensor to_send = gpu.upload(std::vector<double>(4, r + 1.0), dtype);
  Tensor received = gpu.poisoned(4, dtype);
  std::vector<Work> works =
      comm->batch_p2p({P2POp{true, to_send, right, 0}, P2POp{false, received, left, 0}});
  ASSERT_EQ(works.size(), 2u);
  for (Work& w : works) w.wait();
  for (double v : download(received)) EXPECT_EQ(v, left + 1.0);
  // The synchronous pair (with more than one rank: a lone rank's blocking send to itself
  // could wait forever for its receive).
  if (n > 1) {
    if (r % 2 == 0) {
      comm->send(to_send, right);
      comm->recv(received, left);
    } else {
      comm->recv(received, left);
      comm->send(to_send, right);
    }
    for (double v : download(received)) EXPECT_EQ(v, left + 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, NcclCollective,
                         testing::Values(DType::F32, DType::BF16, DType::F64, DType::I32),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

class NcclRouting : public NcclComm {};

TEST_F(NcclRouting, HostTensorsGoToMpiOnTheSameCommunicator) {
  clear_comm_events();
  double loss = r + 0.5;
  int32_t flag = r;
  std::vector<int32_t> ids(size_t(n), -1);
  Tensor device = gpu.upload({1.0, 2.0}, DType::F32);
  comm->all_reduce(view_of(&loss, Shape{1}, DType::F64));                 // seq 0, host
  comm->all_reduce(device);                                               // seq 1, device
  comm->all_reduce(view_of(&flag, Shape{1}, DType::I32), ReduceOp::Max);  // seq 2, host
  comm->all_gather(view_of(ids.data(), Shape{n}, DType::I32),             // seq 3, host
                   view_of(&r, Shape{1}, DType::I32));
  comm->barrier();                               // seq 4
  EXPECT_EQ(loss, n * (n - 1) / 2.0 + 0.5 * n);  // sum_r (r + 0.5)
  EXPECT_EQ(flag, n - 1);
  for (int q = 0; q < n; ++q) EXPECT_EQ(ids[size_t(q)], q);
  EXPECT_EQ(download(device), (std::vector<double>{1.0 * n, 2.0 * n}));

  const std::vector<CommEvent> events = events_of("nccl");
  ASSERT_EQ(events.size(), 5u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq, i);
    EXPECT_EQ(events[i].comm_id, events[0].comm_id);
    EXPECT_GT(events[i].leave_ns, 0) << i << ": the barrier has seen everything done";
  }
  EXPECT_EQ(events[3].kind, CommKind::AllGather);
  EXPECT_EQ(events[4].kind, CommKind::Barrier);

  // A host bf16 reduction goes to MPI's bf16 op; u16 words are moved, never added.
  uint16_t host_bf16 = float_to_bf16(1.0f);
  comm->all_reduce(view_of(&host_bf16, Shape{1}, DType::BF16));
  EXPECT_EQ(bf16_to_float(host_bf16), float(n));
  uint16_t host_u16 = 1;
  try {
    comm->all_reduce(view_of(&host_u16, Shape{1}, DType::U16));
    ADD_FAILURE() << "a host u16 reduction ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }
}

TEST_F(NcclRouting, RefusesMixedDevicesAndMislabelledMemory) {
  std::vector<float> host(static_cast<size_t>(n));
  Tensor device = gpu.alloc(1, DType::F32);
  try {
    comm->all_gather(view_of(host.data(), Shape{n}), device);
    ADD_FAILURE() << "an all_gather from the device into the host ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "communicator 'nccl' all_gather: in is on cuda but out is on cpu"),
              std::string::npos)
        << e.what();
  }
  // Device memory labelled host would reach MPI; host memory labelled device, NCCL.
  Tensor lying = device;
  lying.device = Device::CPU;
  try {
    comm->all_reduce(lying);
    ADD_FAILURE() << "device memory labelled cpu reached MPI";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("labelled cpu but its memory is device memory"),
              std::string::npos)
        << e.what();
  }
  Tensor lying_host = view_of(host.data(), Shape{1}, DType::F32, Device::CUDA);
  EXPECT_THROW(comm->all_reduce(lying_host), std::logic_error);
}

}  // namespace
}  // namespace pentad::parallel::nccl_comm_test
