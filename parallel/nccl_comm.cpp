// The NCCL backend: device memory, the current CUDA device (the launcher picks one per
// local rank before creating communicators), one CUDA stream per communicator, ordered
// with the compute stream by events (comm.h, "Stream rule"). Host tensors never reach this
// file: comm.cpp routes them to the MPI companion made here.
// Bootstrap: rank 0 makes an ncclUniqueId and broadcasts it over a duplicate of the MPI
// communicator. A Work wraps a CUDA event recorded on the stream after the operation.
// NCCL has no tags: point-to-point messages between two ranks match in posting order.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "parallel/backend.h"
#include "parallel/comm.h"
namespace pentad::parallel {
namespace {

void check_cuda(cudaError_t rc, const char* call, const std::string& comm_name) {
  if (rc == cudaSuccess) return;
  fail_with_trace(fmt::format("CUDA error in {} on communicator '{}': {}", call, comm_name,
                              cudaGetErrorString(rc)));
}

void check_nccl(ncclResult_t rc, const char* call, const std::string& comm_name) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  fail_with_trace(fmt::format("NCCL error in {} on communicator '{}': {}", call, comm_name,
                              ncclGetErrorString(rc)));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::U16:
      return ncclUint8;  // moved as bytes (count doubled by the caller)
  }
  return ncclUint8;
}

// Element count in units of nccl_type(dtype).
size_t nccl_count(DType dtype, int64_t numel) {
  return dtype == DType::U16 ? size_t(numel) * 2 : size_t(numel);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator;

// One operation's completion event on the communication stream.
class NcclWork final : public WorkImpl {
 public:
  NcclWork(NcclCommunicator& comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  ~NcclWork() override;
  bool test() override;
  void wait() override;
  bool keep_ticket(const TraceTicket& ticket) override;

 private:
  NcclCommunicator& comm_;  // the communicator outlives its operations
  cudaEvent_t done_;        // null once handed to the communicator's watch list
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name) : Communicator(std::move(name), Backend::NCCL) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      fail(
          "communicator '{}': the NCCL backend needs a CUDA device and rank {} sees none; "
          "use the MPI backend on this machine",
          this->name(), rank_);
    set_host_companion(make_mpi_communicator(comm, this->name()));
    // Rank 0's failure to make an id must reach every rank, not leave them in MPI_Bcast.
    MPI_Comm bootstrap_comm = MPI_COMM_NULL;
    MPI_Comm_dup(comm, &bootstrap_comm);
    struct {
      int ok;
      ncclUniqueId id;
    } bootstrap{};
    if (rank_ == 0) bootstrap.ok = ncclGetUniqueId(&bootstrap.id) == ncclSuccess;
    MPI_Bcast(&bootstrap, sizeof(bootstrap), MPI_BYTE, 0, bootstrap_comm);
    MPI_Comm_free(&bootstrap_comm);
    if (!bootstrap.ok)
      fail_with_trace(
          fmt::format("communicator '{}': ncclGetUniqueId failed on rank 0", this->name()));
    check_nccl(ncclCommInitRank(&comm_, size_, bootstrap.id, rank_), "ncclCommInitRank",
               this->name());
    // Non-blocking: the stream is ordered with the compute stream by our events only.
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", this->name());
    check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "cudaEventCreate",
               this->name());
  }
  ~NcclCommunicator() override {
    // Nothing may throw here: finish what was issued, then stamp and free what is watched.
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [event, ticket] : watched_) {
      if (cudaEventQuery(event) == cudaSuccess) trace_leave(ticket);
      cudaEventDestroy(event);
    }
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    if (compute_ready_) cudaEventDestroy(compute_ready_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Stamps the leave time of every watched operation the device has finished, and throws
  // NCCL's asynchronous error, if any, while one is still running.
  void poll() {
    bool pending = false;
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (!event_done(it->first)) {
        pending = true;
        ++it;
        continue;
      }
      trace_leave(it->second);
      release_event(it->first);
      it = watched_.erase(it);
    }
    if (pending) check_async_error();
  }

  // Queried from NcclWork::test(): done, or not yet (and then no asynchronous error).
  bool event_done(cudaEvent_t event) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) check_cuda(rc, "cudaEventQuery", name());
    return false;
  }
  void check_async_error() {
    ncclResult_t async_error = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async_error), "ncclCommGetAsyncError", name());
    check_nccl(async_error, "a pending operation", name());
  }
  // Later work on the compute stream waits for `done`; the host does not.
  void order_compute_after(cudaEvent_t done) {
    check_cuda(cudaStreamWaitEvent(cudaStreamLegacy, done, 0), "cudaStreamWaitEvent", name());
    poll();
  }
  void watch(cudaEvent_t done, const TraceTicket& ticket) { watched_.emplace_back(done, ticket); }
  void release_event(cudaEvent_t event) noexcept { spare_events_.push_back(event); }

 protected:
  void check_dtype(DType dtype, bool reduction) const override {
    if (reduction && dtype == DType::U16)
      fail("communicator '{}': the NCCL backend cannot reduce u16 tensors", name());
  }

  // A tensor's device must be where its memory is: a host view of device memory would
  // reach MPI (a crash), a device view of host memory NCCL (a fault).
  void check_memory(const Tensor& t, const char* op, const char* what) const override {
    if (t.numel() == 0) return;
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, t.data), "cudaPointerGetAttributes", name());
    const bool on_device = attributes.type == cudaMemoryTypeDevice;
    const bool device_usable = on_device || attributes.type == cudaMemoryTypeManaged;
    PENTAD_CHECK(t.device == Device::CPU ? !on_device : device_usable,
                 "communicator '{}' {}: {} is labelled {} but its memory is {} memory (build "
                 "the view with the device of the memory it points at)",
                 name(), op, what, device_name(t.device), on_device ? "device" : "host");
  }

  std::unique_ptr<WorkImpl> post_all_reduce(Tensor buf, ReduceOp op) override {
    after_compute();
    check_nccl(ncclAllReduce(buf.data, buf.data, size_t(buf.numel()), nccl_type(buf.dtype),
                             nccl_op(op), comm_, stream_),
               "ncclAllReduce", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor out, const Tensor& in,
                                                ReduceOp op) override {
    after_compute();
    check_nccl(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype),
                                 nccl_op(op), comm_, stream_),
               "ncclReduceScatter", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_all_gather(Tensor out, const Tensor& in) override {
    after_compute();
    check_nccl(ncclAllGather(in.data, out.data, nccl_count(in.dtype, in.numel()),
                             nccl_type(in.dtype), comm_, stream_),
               "ncclAllGather", name());
    return make_work();
  }

  // Uneven blocks: one reduce (or broadcast) per rank, rooted at the block's owner, in one
  // group, which NCCL runs as one operation.
  std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor out, const Tensor& in,
                                                  std::span<const int64_t> counts,
                                                  ReduceOp op) override {
    const size_t element = dtype_bytes(in.dtype);
    auto* base = static_cast<const char*>(in.data);
    int64_t offset = 0;
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart", name());
    for (int r = 0; r < size(); ++r) {
      const int64_t n = counts[size_t(r)];
      if (n > 0)
        check_nccl(ncclReduce(base + size_t(offset) * element, out.data, nccl_count(in.dtype, n),
                              nccl_type(in.dtype), nccl_op(op), r, comm_, stream_),
                   "ncclReduce", name());
      offset += n;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_all_gather_v(Tensor buf,
                                              std::span<const int64_t> counts) override {
    const size_t element = dtype_bytes(buf.dtype);
    auto* base = static_cast<char*>(buf.data);
    int64_t offset = 0;
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart", name());
    for (int r = 0; r < size(); ++r) {
      const int64_t n = counts[size_t(r)];
      char* block = base + size_t(offset) * element;
      if (n > 0)
        check_nccl(ncclBroadcast(block, block, nccl_count(buf.dtype, n), nccl_type(buf.dtype), r,
                                 comm_, stream_),
                   "ncclBroadcast", name());
      offset += n;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_all_to_all(Tensor out, const Tensor& in) override {
    std::vector<int64_t> counts(size_t(size()), in.numel() / size());
    return post_all_to_all_v(out, counts, in, counts);
  }

  std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor out, std::span<const int64_t> recv_counts,
                                              const Tensor& in,
                                              std::span<const int64_t> send_counts) override {
    const size_t element = dtype_bytes(in.dtype);
    auto* send_base = static_cast<const char*>(in.data);
    auto* recv_base = static_cast<char*>(out.data);
    int64_t send_offset = 0, recv_offset = 0;
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart", name());
    for (int p = 0; p < size(); ++p) {
      const int64_t send_n = send_counts[size_t(p)], recv_n = recv_counts[size_t(p)];
      if (send_n > 0)
        check_nccl(ncclSend(send_base + size_t(send_offset) * element, nccl_count(in.dtype, send_n),
                            nccl_type(in.dtype), p, comm_, stream_),
                   "ncclSend", name());
      if (recv_n > 0)
        check_nccl(ncclRecv(recv_base + size_t(recv_offset) * element,
                            nccl_count(out.dtype, recv_n), nccl_type(out.dtype), p, comm_, stream_),
                   "ncclRecv", name());
      send_offset += send_n;
      recv_offset += recv_n;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_broadcast(Tensor buf, int root) override {
    after_compute();
    check_nccl(ncclBroadcast(buf.data, buf.data, nccl_count(buf.dtype, buf.numel()),
                             nccl_type(buf.dtype), root, comm_, stream_),
               "ncclBroadcast", name());
    return make_work();
  }

  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart", name());
    for (const P2POp& op : ops) {
      const size_t count = nccl_count(op.buf.dtype, op.buf.numel());
      if (op.is_send)
        check_nccl(ncclSend(op.buf.data, count, nccl_type(op.buf.dtype), op.peer, comm_, stream_),
                   "ncclSend", name());
      else
        check_nccl(ncclRecv(op.buf.data, count, nccl_type(op.buf.dtype), op.peer, comm_, stream_),
                   "ncclRecv", name());
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", name());
    // One group completes as a whole: every op's handle is the same point on the stream.
    std::vector<std::unique_ptr<WorkImpl>> works;
    for (size_t i = 0; i < ops.size(); ++i) works.push_back(make_work());
    return works;
  }

  std::unique_ptr<WorkImpl> post_barrier() override {
    // Every operation of this communicator finishes on the device (polled, so that an
    // asynchronous NCCL error is thrown rather than waited on forever), then every kernel
    // and copy on the compute stream; then the hosts meet over MPI.
    poll();
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) break;
      if (rc != cudaErrorNotReady) check_cuda(rc, "cudaStreamQuery", name());
      check_async_error();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    count_device_wait();
    check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize", name());
    poll();
    return post_host_barrier();
  }

 private:
  // The next operation sees every kernel and copy issued so far on the compute stream.
  // One event serves every operation: a stream wait captures the event's latest record.
  void after_compute() {
    poll();
    check_cuda(cudaEventRecord(compute_ready_, cudaStreamLegacy), "cudaEventRecord", name());
    check_cuda(cudaStreamWaitEvent(stream_, compute_ready_, 0), "cudaStreamWaitEvent", name());
  }

  // The completion event of the operation just enqueued.
  std::unique_ptr<WorkImpl> make_work() {
    cudaEvent_t done = nullptr;
    if (!spare_events_.empty()) {
      done = spare_events_.back();
      spare_events_.pop_back();
    } else {
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate",
                 name());
    }
    auto work = std::make_unique<NcclWork>(*this, done);
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord", name());
    return work;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  // Operations waited for on the device but not yet seen done by the host, in wait order.
  std::deque<std::pair<cudaEvent_t, TraceTicket>> watched_;
  std::vector<cudaEvent_t> spare_events_;  // completion events for reuse
};

NcclWork::~NcclWork() {
  if (done_) comm_.release_event(done_);
}

bool NcclWork::test() {
  if (comm_.event_done(done_)) return true;
  comm_.check_async_error();
  return false;
}

void NcclWork::wait() {
  comm_.order_compute_after(done_);
}

bool NcclWork::keep_ticket(const TraceTicket& ticket) {
  if (comm_.event_done(done_)) return false;  // already done: the leave time is now
  comm_.watch(done_, ticket);
  done_ = nullptr;
  return true;
}

}  // namespace

bool nccl_compiled() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name) {
  return std::make_unique<NcclCommunicator>(comm, std::move(name));
}

}  // namespace pentad::parallel
