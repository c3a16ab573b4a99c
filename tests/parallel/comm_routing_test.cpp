// The communicator's refusals (wrong sizes and dtypes, mixed devices, NCCL without NCCL or
// a device), and the host/device routing every device backend shares, through a fake device
// backend: host tensors go to its MPI companion, device tensors to the backend, one trace
// channel for both.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm_test_util.h"
#include "core/device_memory.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {
namespace {

using namespace comm_test_util;

TEST_F(CommTest, RefusesWrongSizesAndDTypes) {
  std::vector<float> in(static_cast<size_t>(n * 2) + 1), out(2);
  try {
    comm->reduce_scatter(view(out), view(in));
    ADD_FAILURE() << "a reduce_scatter with the wrong input size ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter: in (" + std::to_string(n * 2 + 1)),
              std::string::npos)
        << e.what();
  }
  std::vector<float> gathered(static_cast<size_t>(n));
  EXPECT_THROW(comm->all_gather(view(gathered), view(out)), std::logic_error);
  std::vector<int64_t> counts(static_cast<size_t>(n + 1), 0);
  EXPECT_THROW(comm->all_to_all_v(view(out), counts, view(in), counts), std::logic_error);
  EXPECT_THROW(comm->send(view(out), n, 0), std::logic_error);

  std::vector<uint16_t> u16(4);
  Tensor t{u16.data(), DType::U16, Device::CPU, Shape{4}};
  try {
    comm->all_reduce(t);
    ADD_FAILURE() << "an MPI u16 reduction ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }
  // bf16 moves as raw 16-bit words: all_gather of them.
  std::vector<uint16_t> words{uint16_t(r)}, all(static_cast<size_t>(n));
  comm->all_gather(Tensor{all.data(), DType::BF16, Device::CPU, Shape{int64_t(n)}},
                   Tensor{words.data(), DType::BF16, Device::CPU, Shape{1}});
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q);

  Tensor on_gpu = view(out);
  on_gpu.device = Device::CUDA;
  EXPECT_THROW(comm->all_reduce(on_gpu), std::logic_error);
}

TEST_F(CommTest, MixedDevicesAreRefusedNamingTheCommunicatorAndOp) {
  std::vector<float> host(static_cast<size_t>(n)), one(1);
  Tensor device = view(host);
  device.device = Device::CUDA;  // never dereferenced: the check comes first
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"all_gather", [&] { comm->all_gather(device, view(one)); }},
      {"reduce_scatter", [&] { comm->reduce_scatter(view(one), device); }},
      {"all_to_all", [&] { comm->all_to_all(device, view(host)); }},
  };
  for (const auto& [op, call] : calls) {
    try {
      call();
      ADD_FAILURE() << op << " ran with one tensor on the host and one on the device";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("communicator 'test' " + op + ": in is on "),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
    }
  }
}

// A device backend in name only: its "device" tensors are host memory labelled CUDA, and
// each of its hooks only logs that it was called. Host tensors must not reach it.
class FakeDeviceComm final : public Communicator {
 public:
  explicit FakeDeviceComm(MPI_Comm comm) : Communicator("fake", Backend::NCCL) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    set_host_companion(make_mpi_communicator(comm, name()));
  }
  // An operation the host has not seen finish after wait(): it keeps the trace ticket
  // until finish_all(), like an NCCL operation waiting on the device.
  class PendingWork final : public WorkImpl {
   public:
    explicit PendingWork(FakeDeviceComm& comm) : comm_(comm) {}
    bool test() override { return false; }
    void wait() override {}
    bool keep_ticket(const TraceTicket& ticket) override {
      comm_.kept.push_back(ticket);
      return true;
    }

   private:
    FakeDeviceComm& comm_;
  };
  void finish_all() {
    for (const TraceTicket& t : kept) trace_leave(t);
    kept.clear();
  }

  std::vector<std::string> log;
  std::vector<TraceTicket> kept;
  mutable int memory_checks = 0;

 protected:
  // The fake moves no data, so it takes every dtype (u16 reductions too, which MPI refuses).
  void check_dtype(DType, bool) const override {}
  void check_memory(const Tensor&, const char*, const char*) const override { ++memory_checks; }
  std::unique_ptr<WorkImpl> logged(const std::string& what) {
    log.push_back(what);
    return std::make_unique<PendingWork>(*this);
  }
  std::unique_ptr<WorkImpl> post_all_reduce(Tensor, ReduceOp) override {
    return logged("all_reduce");
  }
  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor, const Tensor&, ReduceOp) override {
    return logged("reduce_scatter");
  }
  std::unique_ptr<WorkImpl> post_all_gather(Tensor, const Tensor&) override {
    return logged("all_gather");
  }
  std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor, const Tensor&, std::span<const int64_t>,
                                                  ReduceOp) override {
    return logged("reduce_scatter_v");
  }
  std::unique_ptr<WorkImpl> post_all_gather_v(Tensor, std::span<const int64_t>) override {
    return logged("all_gather_v");
  }
  std::unique_ptr<WorkImpl> post_all_to_all(Tensor, const Tensor&) override {
    return logged("all_to_all");
  }
  std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor, std::span<const int64_t>, const Tensor&,
                                              std::span<const int64_t>) override {
    return logged("all_to_all_v");
  }
  std::unique_ptr<WorkImpl> post_broadcast(Tensor, int) override { return logged("broadcast"); }
  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
    std::vector<std::unique_ptr<WorkImpl>> works;
    for (const P2POp& op : ops) works.push_back(logged(op.is_send ? "send" : "recv"));
    return works;
  }
  std::unique_ptr<WorkImpl> post_barrier() override {
    log.push_back("barrier");
    return post_host_barrier();
  }
};

TEST_F(CommTest, DeviceBackendRoutesHostTensorsToItsMpiCompanion) {
  clear_comm_events();
  FakeDeviceComm fake(MPI_COMM_WORLD);
  ASSERT_EQ(fake.rank(), r);
  std::vector<double> loss{double(r) + 0.5};
  std::vector<int32_t> flag{r}, ids{r}, all(static_cast<size_t>(n), -1);
  std::vector<float> grads(4, 1.0f);
  Tensor device = view(grads);
  device.device = Device::CUDA;

  fake.all_reduce(view(loss));                 // seq 0, host: MPI
  fake.all_reduce(device);                     // seq 1, device
  fake.all_reduce(view(flag), ReduceOp::Max);  // seq 2, host
  fake.all_gather(view(all), view(ids));       // seq 3, host
  fake.broadcast(device, 0);                   // seq 4, device
  fake.barrier();                              // seq 5: the backend's, then the hosts'
  EXPECT_EQ(loss[0], double(n) * double(n - 1) / 2 + 0.5 * n);  // sum_r (r + 0.5)
  EXPECT_EQ(flag[0], n - 1);
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q);
  EXPECT_EQ(grads[0], 1.0f);  // the fake backend does not move data
  EXPECT_EQ(fake.log, (std::vector<std::string>{"all_reduce", "broadcast", "barrier"}));
  EXPECT_EQ(fake.memory_checks, 6);  // every tensor of every operation

  // One channel, one sequence for both routes. The device operations were waited for but
  // not seen done: PENDING until the backend stamps them.
  std::vector<CommEvent> events = events_of("fake");
  ASSERT_EQ(events.size(), 6u);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq, i);
  for (const CommEvent& e : events) EXPECT_EQ(e.comm_id, events[0].comm_id);
  EXPECT_EQ(events[3].kind, CommKind::AllGather);
  EXPECT_EQ(events[5].kind, CommKind::Barrier);
  for (size_t i : {0u, 2u, 3u, 5u}) EXPECT_GT(events[i].leave_ns, 0) << i;
  for (size_t i : {1u, 4u}) EXPECT_EQ(events[i].leave_ns, 0) << i;
  fake.finish_all();
  events = events_of("fake");
  for (size_t i : {1u, 4u}) EXPECT_GE(events[i].leave_ns, events[i].enter_ns) << i;

  // Dtype rules follow the route: the fake device backend reduces u16 words, MPI does not.
  std::vector<uint16_t> u16(2);
  Tensor host_u16{u16.data(), DType::U16, Device::CPU, Shape{2}};
  Tensor device_u16{u16.data(), DType::U16, Device::CUDA, Shape{2}};
  fake.all_reduce(device_u16);
  try {
    fake.all_reduce(host_u16);
    ADD_FAILURE() << "a host u16 reduction reached MPI";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }

  // A batch may mix: the host ops form one MPI batch (a ring exchange), the device op goes
  // to the backend, and each op keeps its own handle in order.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<int32_t> out{r * 7}, in{-1};
  std::vector<P2POp> ops{P2POp{true, view(out), right, 2}, P2POp{true, device, right, 0},
                         P2POp{false, view(in), left, 2}};
  std::vector<Work> works = fake.batch_p2p(std::move(ops));
  ASSERT_EQ(works.size(), 3u);
  works[0].wait();
  works[2].wait();
  EXPECT_EQ(in[0], left * 7);
  EXPECT_TRUE(works[0].done() && works[2].done());
  EXPECT_FALSE(works[1].test());  // the fake device never finishes by itself
  works[1].wait();
  EXPECT_EQ(fake.log.back(), "send");

  // Mixed devices within one operation: refused before anything is posted.
  const size_t logged = fake.log.size();
  std::vector<float> gathered(static_cast<size_t>(4 * n));
  Tensor device_gathered = view(gathered);
  device_gathered.device = Device::CUDA;
  try {
    fake.all_gather(device_gathered, view(grads));
    ADD_FAILURE() << "an all_gather from the host into the device ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'fake' all_gather: in is on cpu but out "
                                         "is on cuda"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fake.log.size(), logged);
  fake.finish_all();
  fake.barrier();
}

TEST_F(CommTest, NcclWithoutNcclIsAClearError) {
  if (backend_available(Backend::NCCL))
    GTEST_SKIP() << "this build has NCCL; creating one needs a GPU per rank";
  try {
    make_communicator(Backend::NCCL, MPI_COMM_WORLD, "nccl");
    ADD_FAILURE() << "made an NCCL communicator without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
  }
}

TEST_F(CommTest, NcclWithoutADeviceIsAClearError) {
  if (!backend_available(Backend::NCCL)) GTEST_SKIP() << "this build has no NCCL";
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU (tests/cuda tests NCCL)";
  try {
    make_communicator(Backend::NCCL, MPI_COMM_WORLD, "nccl");
    ADD_FAILURE() << "made an NCCL communicator without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nccl': the NCCL backend needs a CUDA device"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pentad::parallel
