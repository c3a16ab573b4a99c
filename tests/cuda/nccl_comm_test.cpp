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
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/pp/rounds.h"

namespace pentad {

// How gtest (and so the ctest names) print the dtype parameter.
void PrintTo(DType dtype, std::ostream* os) {
  *os << dtype_name(dtype);
}

namespace parallel {
namespace {

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
std::vector<double> download(const Tensor& t) {
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

std::vector<CommEvent> events_of(const std::string& name) {
  std::vector<CommEvent> out;
  for (const CommEvent& e : comm_events())
    if (e.name() == name) out.push_back(e);
  return out;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// NCCL, or the staged backend where PENTAD_COMM_TEST_BACKEND=staged.
Backend tested_backend() {
  const char* backend = std::getenv("PENTAD_COMM_TEST_BACKEND");
  return backend && std::string(backend) == "staged" ? Backend::Staged : Backend::NCCL;
}

class NcclComm : public testing::Test {
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

// ---- the stream rule ----

class NcclStreams : public NcclComm {};

// Each repetition: a kernel writes `in`; an all-gather copies it into `out` on the
// communication stream; a kernel reads `out`. The next repetition's kernel overwrites
// `in` while the host has long moved on. Each of the four orderings (write in -> gather,
// gather -> read out, gather -> next write of in, read out -> next gather) is needed for
// the sums; the host never waits until the end, so it runs far ahead of the device.
TEST_F(NcclStreams, KernelsAndCollectivesStayOrderedWithoutTheHostWaiting) {
  // 64 MiB per f32 buffer: each kernel takes a while. Staged: 4 MiB, which every operation
  // moves through host memory (and the host waits for the kernels before each one anyway).
  const int64_t m = int64_t(1) << (tested_backend() == Backend::Staged ? 20 : 24);
  const int reps = 100;
  // Every copy from the host is made before the loop: one from pageable memory would
  // synchronize the compute stream and let the device catch up with the host.
  Tensor in = gpu.upload(std::vector<double>(size_t(m), double(r + 1)), DType::F32);
  Tensor out = gpu.alloc(m * n, DType::F32);
  Tensor acc = gpu.alloc(m * n, DType::F32), acc_reduced = gpu.alloc(m * n, DType::F32);
  device_zero(acc.data, acc.bytes());
  device_zero(acc_reduced.data, acc_reduced.bytes());
  comm->barrier();
  double factor_sum = 0;  // sum over repetitions of in's factor after its kernel
  double factor = 1;
  for (int rep = 0; rep < reps; ++rep) {
    const float s = rep % 2 == 0 ? 2.0f : 0.5f;  // in alternates 2(r+1), (r+1): exact
    kernels::scale(in, s);
    factor *= s;
    factor_sum += factor;
    if (rep % 3 == 0) {
      comm->all_gather(out, in);  // synchronous: still only a stream wait
    } else {
      Work w = comm->all_gather(out, in, /*async=*/true);
      w.wait();
    }
    kernels::add(acc, acc, out);
    // In place, after the kernel that read out: out = n × the gathered blocks.
    Work w = comm->all_reduce(out, ReduceOp::Sum, /*async=*/true);
    w.wait();
    kernels::add(acc_reduced, acc_reduced, out);
  }
  const std::vector<double> got = download(acc), got_reduced = download(acc_reduced);
  size_t bad = 0, first_bad = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < m; ++i) {
      const size_t at = size_t(q * m + i);
      const double want = (q + 1) * factor_sum;  // block q came from rank q
      if ((got[at] != want || got_reduced[at] != n * want) && bad++ == 0) first_bad = at;
    }
  EXPECT_EQ(bad, 0u) << "first wrong element " << first_bad << ": " << got[first_bad] << " and "
                     << got_reduced[first_bad] << ", wanted "
                     << (int64_t(first_bad) / m + 1) * factor_sum;
}

// wait() only queues a stream wait: right after it, with seconds of kernels still ahead
// on the device, the trace shows the operation pending; barrier() waits for all of it.
TEST_F(NcclStreams, WaitDoesNotBlockTheHostAndBarrierDoes) {
  const int64_t m = int64_t(1) << 26;  // 256 MiB
  Tensor x = gpu.alloc(m, DType::F32);
  device_zero(x.data, x.bytes());
  Tensor small = gpu.upload({double(r)}, DType::F32);  // before the kernels (see above)
  comm->barrier();
  for (int i = 0; i < 200; ++i) kernels::scale(x, 1.0f);  // ~0.2 ms each on an H100
  clear_comm_events();
  Work w = comm->all_reduce(small, ReduceOp::Sum, /*async=*/true);
  w.wait();
  std::vector<CommEvent> events = events_of("nccl");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].leave_ns, 0) << "wait() blocked the host until the device finished";
  comm->barrier();
  events = events_of("nccl");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_GT(events[0].leave_ns, 0);
  EXPECT_EQ(download(small)[0], n * (n - 1) / 2.0);
}

// Pipeline transfers of device tensors in rounds (parallel/pp/rounds.h), on one GPU. Two
// real stages need two GPUs (NCCL refuses two ranks on one device), so this rank plays both
// stages of 1F1B over 4 micro-batches (and the two chunks per stage of interleaved 1F1B):
// each round, the passes of that round as kernels (a forward adds its virtual stage + 1 to
// its input; a backward doubles the gradient it gets, the last one starts from 1), then one
// group with every transfer of the round, sent to and received from itself, no host wait
// in between. What arrives is what the schedule implies: micro-batch k leaves the last
// virtual stage as k + 1 + (1 + 2 + ... + V), and virtual stage 0 gets 2^V. Every buffer is
// allocated before the rounds (allocating waits), so the host must not wait at all.
// tests/pp/rounds_test.cpp checks the order of every schedule against NCCL's semantics;
// tests/parallel/pipeline_stage_test.cpp runs the executor's rounds over MPI.
TEST_F(NcclComm, PipelineRoundsMoveDeviceTensorsOnOneGpu) {
  if (n != 1) GTEST_SKIP() << "plays every stage on one rank";
  using pp::Action;
  for (const pp::ScheduleSpec spec :
       {pp::ScheduleSpec{pp::ScheduleKind::OneFOneB, 2, 4, 1, 1},
        pp::ScheduleSpec{pp::ScheduleKind::Interleaved, 2, 4, 2, 1}}) {
    const int p = spec.stages, v = spec.virtual_stages, V = p * v, m = spec.micro_batches;
    std::vector<std::vector<Action>> lists;
    std::vector<pp::RoundPlan> plans;
    for (int s = 0; s < p; ++s) lists.push_back(pp::stage_actions(spec, s));
    for (int s = 0; s < p; ++s) plans.push_back(pp::plan_rounds(lists, v, s));
    const int64_t width = 1000;
    // Every value the emulation touches: inputs, outputs and arrivals, keyed by transfer.
    std::map<std::tuple<int, int, int>, Tensor> arrived;  // (type, micro, to vs)
    std::map<std::tuple<int, int, int>, Tensor> produced;
    std::vector<Tensor> adds;  // vs + 1, per virtual stage
    for (int vs = 0; vs < V; ++vs)
      adds.push_back(gpu.upload(std::vector<double>(width, vs + 1.0), DType::F32));
    std::vector<Tensor> inputs, final_out(static_cast<size_t>(m)),
        first_grads(static_cast<size_t>(m));
    for (int k = 0; k < m; ++k)
      inputs.push_back(gpu.upload(std::vector<double>(width, k + 1.0), DType::F32));
    const Tensor one = gpu.upload(std::vector<double>(width, 1.0), DType::F32);
    std::vector<std::vector<Tensor>> outs(static_cast<size_t>(p));
    for (int s = 0; s < p; ++s)
      for (size_t i = 0; i < lists[size_t(s)].size(); ++i)
        outs[size_t(s)].push_back(gpu.alloc(width, DType::F32));
    size_t rounds = 0;
    for (const pp::RoundPlan& plan : plans) {
      rounds = std::max(rounds, plan.groups.size());
      for (const auto& group : plan.groups)
        for (const pp::Transfer& t : group)
          if (!arrived.count({int(t.type), t.micro, t.to_virtual_stage}))
            arrived[{int(t.type), t.micro, t.to_virtual_stage}] = gpu.alloc(width, DType::F32);
    }
    const int64_t waits = device_waits();
    for (size_t round = 0; round < rounds; ++round) {
      for (int s = 0; s < p; ++s)
        for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
          if (plans[size_t(s)].round_of_action[i] != int(round)) continue;
          const Action& a = lists[size_t(s)][i];
          const int vs = a.chunk * p + s;
          const Tensor out = outs[size_t(s)][i];
          if (a.type == Action::Forward) {
            const Tensor in = vs == 0 ? inputs[size_t(a.micro)] : arrived.at({0, a.micro, vs});
            kernels::add(out, in, adds[size_t(vs)]);
            if (vs == V - 1)
              final_out[size_t(a.micro)] = out;
            else
              produced[{0, a.micro, vs + 1}] = out;
          } else {
            const Tensor g = vs == V - 1 ? one : arrived.at({1, a.micro, vs});
            kernels::add(out, g, g);
            if (vs == 0)
              first_grads[size_t(a.micro)] = out;
            else
              produced[{1, a.micro, vs - 1}] = out;
          }
        }
      // The round's group: every transfer once (both stages list it), sent to this rank.
      std::vector<P2POp> ops;
      std::set<std::tuple<int, int, int>> seen;
      for (const pp::RoundPlan& plan : plans) {
        if (round >= plan.groups.size()) continue;
        for (const pp::Transfer& t : plan.groups[round]) {
          const std::tuple<int, int, int> key{int(t.type), t.micro, t.to_virtual_stage};
          if (!seen.insert(key).second) continue;
          ops.push_back({true, produced.at(key), 0, 0});
          ops.push_back({false, arrived.at(key), 0, 0});
        }
      }
      if (!ops.empty()) comm->batch_p2p(ops);  // Works dropped: waits on the device only
    }
    EXPECT_EQ(device_waits(), waits) << "the host waited during the rounds";
    for (int k = 0; k < m; ++k) {
      EXPECT_EQ(download(final_out[size_t(k)])[width - 1], k + 1 + V * (V + 1) / 2.0)
          << pp::schedule_name(spec.kind) << " micro-batch " << k;
      EXPECT_EQ(download(first_grads[size_t(k)])[0], double(1 << V))
          << pp::schedule_name(spec.kind) << " micro-batch " << k;
    }
  }
}

}  // namespace
}  // namespace parallel
}  // namespace pentad
