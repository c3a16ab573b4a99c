// The NCCL backend: device memory, the current CUDA device (the launcher picks one per
// local rank before creating communicators), one CUDA stream per communicator.
// Bootstrap: rank 0 makes an ncclUniqueId and broadcasts it over a duplicate of the MPI
// communicator. A Work wraps a CUDA event recorded on the stream after the operation.
// NCCL has no tags: point-to-point messages between two ranks match in posting order.
#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

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

class NcclWork final : public WorkImpl {
 public:
  NcclWork(cudaStream_t stream, ncclComm_t comm, const std::string& comm_name)
      : comm_(comm), comm_name_(comm_name) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate",
               comm_name_);
    check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord", comm_name_);
  }
  ~NcclWork() override { cudaEventDestroy(event_); }

  bool test() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) check_cuda(rc, "cudaEventQuery", comm_name_);
    ncclResult_t async_error = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async_error), "ncclCommGetAsyncError", comm_name_);
    check_nccl(async_error, "a pending operation", comm_name_);
    return false;
  }
  void wait() override {
    check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize", comm_name_);
  }

 private:
  cudaEvent_t event_ = nullptr;
  ncclComm_t comm_;
  const std::string& comm_name_;  // the communicator outlives its operations
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
    MPI_Comm_dup(comm, &mpi_comm_);
    // Rank 0's failure to make an id must reach every rank, not leave them in MPI_Bcast.
    struct {
      int ok;
      ncclUniqueId id;
    } bootstrap{};
    if (rank_ == 0) bootstrap.ok = ncclGetUniqueId(&bootstrap.id) == ncclSuccess;
    MPI_Bcast(&bootstrap, sizeof(bootstrap), MPI_BYTE, 0, mpi_comm_);
    if (!bootstrap.ok)
      fail_with_trace(
          fmt::format("communicator '{}': ncclGetUniqueId failed on rank 0", this->name()));
    const ncclUniqueId& id = bootstrap.id;
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank", this->name());
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate", this->name());
  }
  ~NcclCommunicator() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_comm_);
  }

 protected:
  void check_dtype(DType dtype, bool reduction) const override {
    if (reduction && dtype == DType::U16)
      fail("communicator '{}': the NCCL backend cannot reduce u16 tensors", name());
  }

  std::unique_ptr<WorkImpl> post_all_reduce(Tensor buf, ReduceOp op) override {
    check_nccl(ncclAllReduce(buf.data, buf.data, size_t(buf.numel()), nccl_type(buf.dtype),
                             nccl_op(op), comm_, stream_),
               "ncclAllReduce", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor out, const Tensor& in,
                                                ReduceOp op) override {
    check_nccl(ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype),
                                 nccl_op(op), comm_, stream_),
               "ncclReduceScatter", name());
    return make_work();
  }

  std::unique_ptr<WorkImpl> post_all_gather(Tensor out, const Tensor& in) override {
    check_nccl(ncclAllGather(in.data, out.data, nccl_count(in.dtype, in.numel()),
                             nccl_type(in.dtype), comm_, stream_),
               "ncclAllGather", name());
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
    check_nccl(ncclBroadcast(buf.data, buf.data, nccl_count(buf.dtype, buf.numel()),
                             nccl_type(buf.dtype), root, comm_, stream_),
               "ncclBroadcast", name());
    return make_work();
  }

  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
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
    // Device work issued so far finishes first, then the hosts meet.
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", name());
    MPI_Barrier(mpi_comm_);
    return make_work();
  }

 private:
  std::unique_ptr<WorkImpl> make_work() {
    return std::make_unique<NcclWork>(stream_, comm_, name());
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

bool nccl_compiled() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name) {
  return std::make_unique<NcclCommunicator>(comm, std::move(name));
}

}  // namespace pentad::parallel
