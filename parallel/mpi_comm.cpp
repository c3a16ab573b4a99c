// The MPI backend: host memory, non-blocking MPI_I* calls on a duplicated communicator
// whose error handler returns errors (so they reach pentad::Error with the trace dumped)
// instead of aborting the job.
#include <algorithm>
#include <climits>
#include <vector>

#include "core/bf16.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {
namespace {

void check_mpi(int rc, const char* call, const std::string& comm_name) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail_with_trace(fmt::format("MPI error in {} on communicator '{}': {}", call, comm_name,
                              std::string(text, size_t(length))));
}

int to_int(int64_t n, const char* what) {
  PENTAD_CHECK(n >= 0 && n <= INT_MAX, "{} = {} does not fit an MPI count (int)", what, n);
  return static_cast<int>(n);
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::BF16:  // moved as raw 16-bit words, reduced by the ops below
    case DType::U16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// bf16 reductions: MPI has no bf16 type, so the words travel as MPI_UINT16_T and these
// user ops combine them. Each pair is widened to f32, combined, and rounded back to the
// nearest bf16 (ties to even), as NCCL's bf16 sum rounds each pairwise step to bf16 on the
// device, so a host bf16 reduction (tests, the CPU backend) rounds like a device one. With
// more than two ranks the result is rounded after every pairwise step, in the order MPI
// picks.
template <typename Combine>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int n = 0; n < *len; ++n)
    b[n] = float_to_bf16(Combine{}(bf16_to_float(a[n]), bf16_to_float(b[n])));
}
struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Larger {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Smaller {
  float operator()(float a, float b) const { return std::min(a, b); }
};

MPI_Op make_op(MPI_User_function* function) {
  MPI_Op made = MPI_OP_NULL;
  PENTAD_CHECK(MPI_Op_create(function, /*commute=*/1, &made) == MPI_SUCCESS,
               "MPI_Op_create failed for a bf16 reduction");
  return made;
}

MPI_Op bf16_op(ReduceOp op) {
  // Created once, after MPI_Init (at the first bf16 reduction); MPI_Finalize frees them.
  static const MPI_Op sum = make_op(&bf16_reduce<Add>), max = make_op(&bf16_reduce<Larger>),
                      min = make_op(&bf16_reduce<Smaller>);
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Max:
      return max;
    case ReduceOp::Min:
      return min;
  }
  return MPI_OP_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::BF16) return bf16_op(op);
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

class MpiWork final : public WorkImpl {
 public:
  MpiWork(const std::string& comm_name, const char* call) : comm_name_(comm_name), call_(call) {}
  bool test() override {
    int flag = 0;
    check_mpi(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), call_, comm_name_);
    return flag != 0;
  }
  void wait() override { check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), call_, comm_name_); }

  MPI_Request request = MPI_REQUEST_NULL;
  // The v-collectives read their count arrays until completion, so they live here.
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;

 private:
  const std::string& comm_name_;  // the communicator outlives its operations
  const char* call_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name) : Communicator(std::move(name), Backend::MPI) {
    check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", this->name());
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

 protected:
  void check_dtype(DType dtype, bool reduction) const override {
    if (reduction && dtype == DType::U16)
      fail(
          "communicator '{}': the MPI backend reduces f32, f64, i32 and bf16 tensors, not {}: "
          "u16 words are moved, never added",
          name(), dtype_name(dtype));
  }

  std::unique_ptr<WorkImpl> post_all_reduce(Tensor buf, ReduceOp op) override {
    auto work = make_work("MPI_Iallreduce");
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.data, to_int(buf.numel(), "all_reduce count"),
                             mpi_type(buf.dtype), mpi_op(op, buf.dtype), comm_, &work->request),
              "MPI_Iallreduce", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor out, const Tensor& in,
                                                ReduceOp op) override {
    auto work = make_work("MPI_Ireduce_scatter_block");
    check_mpi(
        MPI_Ireduce_scatter_block(in.data, out.data, to_int(out.numel(), "reduce_scatter count"),
                                  mpi_type(in.dtype), mpi_op(op, in.dtype), comm_, &work->request),
        "MPI_Ireduce_scatter_block", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_all_gather(Tensor out, const Tensor& in) override {
    auto work = make_work("MPI_Iallgather");
    const int count = to_int(in.numel(), "all_gather count");
    check_mpi(MPI_Iallgather(in.data, count, mpi_type(in.dtype), out.data, count,
                             mpi_type(out.dtype), comm_, &work->request),
              "MPI_Iallgather", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor out, const Tensor& in,
                                                  std::span<const int64_t> counts,
                                                  ReduceOp op) override {
    auto work = make_work("MPI_Ireduce_scatter");
    pack_counts(counts, work->recv_counts, work->recv_displs);
    check_mpi(MPI_Ireduce_scatter(in.data, out.data, work->recv_counts.data(), mpi_type(in.dtype),
                                  mpi_op(op, in.dtype), comm_, &work->request),
              "MPI_Ireduce_scatter", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_all_gather_v(Tensor buf,
                                              std::span<const int64_t> counts) override {
    auto work = make_work("MPI_Iallgatherv");
    pack_counts(counts, work->recv_counts, work->recv_displs);
    check_mpi(
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data, work->recv_counts.data(),
                        work->recv_displs.data(), mpi_type(buf.dtype), comm_, &work->request),
        "MPI_Iallgatherv", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_all_to_all(Tensor out, const Tensor& in) override {
    auto work = make_work("MPI_Ialltoall");
    const int count = to_int(in.numel() / size(), "all_to_all block");
    check_mpi(MPI_Ialltoall(in.data, count, mpi_type(in.dtype), out.data, count,
                            mpi_type(out.dtype), comm_, &work->request),
              "MPI_Ialltoall", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor out, std::span<const int64_t> recv_counts,
                                              const Tensor& in,
                                              std::span<const int64_t> send_counts) override {
    auto work = make_work("MPI_Ialltoallv");
    pack_counts(send_counts, work->send_counts, work->send_displs);
    pack_counts(recv_counts, work->recv_counts, work->recv_displs);
    check_mpi(MPI_Ialltoallv(in.data, work->send_counts.data(), work->send_displs.data(),
                             mpi_type(in.dtype), out.data, work->recv_counts.data(),
                             work->recv_displs.data(), mpi_type(out.dtype), comm_, &work->request),
              "MPI_Ialltoallv", name());
    return work;
  }

  std::unique_ptr<WorkImpl> post_broadcast(Tensor buf, int root) override {
    auto work = make_work("MPI_Ibcast");
    check_mpi(MPI_Ibcast(buf.data, to_int(buf.numel(), "broadcast count"), mpi_type(buf.dtype),
                         root, comm_, &work->request),
              "MPI_Ibcast", name());
    return work;
  }

  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
    std::vector<std::unique_ptr<WorkImpl>> works;
    works.reserve(ops.size());
    for (const P2POp& op : ops) {
      const char* call = op.is_send ? "MPI_Isend" : "MPI_Irecv";
      auto work = make_work(call);
      const int count = to_int(op.buf.numel(), "p2p count");
      const int rc = op.is_send ? MPI_Isend(op.buf.data, count, mpi_type(op.buf.dtype), op.peer,
                                            op.tag, comm_, &work->request)
                                : MPI_Irecv(op.buf.data, count, mpi_type(op.buf.dtype), op.peer,
                                            op.tag, comm_, &work->request);
      check_mpi(rc, call, name());
      works.push_back(std::move(work));
    }
    return works;
  }

  std::unique_ptr<WorkImpl> post_barrier() override {
    auto work = make_work("MPI_Ibarrier");
    check_mpi(MPI_Ibarrier(comm_, &work->request), "MPI_Ibarrier", name());
    return work;
  }

 private:
  std::unique_ptr<MpiWork> make_work(const char* call) const {
    return std::make_unique<MpiWork>(name(), call);
  }

  static void pack_counts(std::span<const int64_t> counts, std::vector<int>& out,
                          std::vector<int>& displs) {
    out.resize(counts.size());
    displs.resize(counts.size());
    int64_t offset = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      out[p] = to_int(counts[p], "all_to_all_v count");
      displs[p] = to_int(offset, "all_to_all_v displacement");
      offset += counts[p];
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name) {
  return std::make_unique<MpiCommunicator>(comm, std::move(name));
}

}  // namespace pentad::parallel
