// The staged backend: tensors of any device move through host memory, and an MPI
// communicator over the same ranks (the host collectives: MPI's, and pentad's rings where
// the MPI backend runs them) does the moving. It is how several ranks share one GPU (NCCL
// takes one GPU per rank) and the fallback in builds without NCCL; parallel/backend_choice.h
// says when a job takes it.
//
// Each operation: acquire a block of host staging (core/device_memory.h, HostStaging:
// page-locked where a CUDA device is visible), download what the operation reads into it,
// post the MPI communicator's own hook on the staged copies, and, once MPI has finished,
// upload what it wrote back to the caller's tensors and give the block back. Host tensors
// take the same path (their copies are memcpy), so the CPU tests cover its logic.
//
// Stream rule (device tensors). Downloads are queued on the compute stream (the legacy
// default stream, kernels/cuda/cuda_ops.h) and the host waits for them before posting: an
// operation sees every kernel and copy issued before it, as with NCCL, and the host waits
// there for the device to get that far (unlike NCCL, which waits on its own stream). MPI
// then moves host memory while kernels run. Work::test() and Work::wait() drive MPI, like
// the MPI backend (no progress thread); once MPI is done they queue the uploads on the
// compute stream and return without waiting for them: later kernels, and cudaMemcpy to
// the host, see the result; code that reads device memory through another stream orders
// itself after the compute stream (AsyncCopier::begin_after_compute) after the wait, as
// with NCCL. A block is handed out again only after the device has run its uploads.
// barrier() waits for the device (every kernel and copy issued before it; once device
// tensors have passed), then for every rank.
// Trace: one event per operation, on this communicator's channel; its leave time is when
// the host saw MPI finish and queued the uploads.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {

// A tensor's bytes: where they are, on which device, how many.
struct StagedSpan {
  void* data = nullptr;
  Device device = Device::CPU;
  size_t bytes = 0;
};

// Elements [first, first + count) of t.
static StagedSpan span_of(const Tensor& t, int64_t first, int64_t count) {
  const size_t element = dtype_bytes(t.dtype);
  return {static_cast<char*>(t.data) + size_t(first) * element, t.device, size_t(count) * element};
}

static StagedSpan whole(const Tensor& t) {
  return span_of(t, 0, t.numel());
}

// Gives a staging block back from a destructor, which may run while an error unwinds: a
// failure (a bookkeeping error, named by HostStaging) goes to stderr instead of throwing.
static void release_quietly(HostStaging& staging, void* block) noexcept {
  if (!block) return;
  try {
    staging.release(block);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pentad: staged communicator: %s\n", e.what());
  }
}

class StagedCommunicator;

// One staged operation: the MPI operation on the staging, the block it uses, and the copies
// back to the caller's tensors once it is done.
class StagedWork final : public WorkImpl {
 public:
  struct Upload {
    StagedSpan to;
    const char* from = nullptr;  // inside the block
  };
  StagedWork(HostStaging& staging, void* block, std::unique_ptr<WorkImpl> posted,
             std::vector<Upload> uploads)
      : staging_(staging),
        block_(block),
        posted_(std::move(posted)),
        uploads_(std::move(uploads)) {}
  ~StagedWork() override {
    // MPI may still read or write the block (Work waits before dropping its WorkImpl, so only
    // an error unwinding can leave it pending): it must finish before the block is reused.
    // Nothing here may throw: this runs while an error unwinds.
    try {
      if (posted_) posted_->wait();
    } catch (...) {  // already reported: the trace is on stderr
    }
    give_back();
  }
  bool test() override {
    if (posted_ && !posted_->test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (posted_) posted_->wait();
    finish();
  }

 private:
  void finish() {
    posted_.reset();
    if (!block_) return;
    try {
      for (const Upload& u : uploads_) staging_.upload(u.to.data, u.to.device, u.from, u.to.bytes);
    } catch (...) {
      give_back();  // the error is the caller's; the block is not released twice
      throw;
    }
    staging_.release(std::exchange(block_, nullptr));
  }
  void give_back() noexcept { release_quietly(staging_, std::exchange(block_, nullptr)); }

  HostStaging& staging_;  // the communicator outlives its operations
  void* block_;
  std::unique_ptr<WorkImpl> posted_;
  std::vector<Upload> uploads_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(MPI_Comm comm, std::string name)
      : Communicator(std::move(name), Backend::Staged),
        mpi_(make_mpi_communicator(comm, this->name())) {
    rank_ = mpi_->rank();
    size_ = mpi_->size();
    // The rings' legs sample the link matrix by world rank (parallel/activity.h).
    mpi_->set_trace_members(world_ranks_of(comm));
  }
  ~StagedCommunicator() override = default;

 protected:
  void check_dtype(DType dtype, bool reduction) const override {
    if (reduction && dtype == DType::U16)
      fail(
          "communicator '{}': the staged backend reduces f32, f64, i32 and bf16 tensors, not {}: "
          "u16 words are moved, never added",
          name(), dtype_name(dtype));
  }

  std::unique_ptr<WorkImpl> post_all_reduce(Tensor buf, ReduceOp op) override {
    Staging s(*this, buf.bytes(), buf.device);
    const Tensor staged = s.download(buf);
    s.wait_downloads();
    // pentad's ring where the MPI backend would run it on host memory (Communicator::all_reduce)
    if (ring_all_reduce_ && op == ReduceOp::Sum && buf.dtype == DType::F32 && size() > 1)
      return s.posted(ring_all_reduce(staged), {{whole(buf), s.at(staged)}});
    return s.posted(mpi_->post_all_reduce(staged, op), {{whole(buf), s.at(staged)}});
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor out, const Tensor& in,
                                                ReduceOp op) override {
    Staging s(*this, in.bytes() + out.bytes(), in.device);
    const Tensor staged_in = s.download(in);
    const Tensor staged_out = s.take(out);
    s.wait_downloads();
    return s.posted(mpi_->post_reduce_scatter(staged_out, staged_in, op),
                    {{whole(out), s.at(staged_out)}});
  }

  std::unique_ptr<WorkImpl> post_all_gather(Tensor out, const Tensor& in) override {
    Staging s(*this, in.bytes() + out.bytes(), in.device);
    const Tensor staged_in = s.download(in);
    const Tensor staged_out = s.take(out);
    s.wait_downloads();
    return s.posted(mpi_->post_all_gather(staged_out, staged_in), {{whole(out), s.at(staged_out)}});
  }

  std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor out, const Tensor& in,
                                                  std::span<const int64_t> counts,
                                                  ReduceOp op) override {
    const int64_t mine = counts[size_t(rank())];  // out may be longer: the rest is untouched
    Staging s(*this, in.bytes() + size_t(mine) * dtype_bytes(out.dtype), in.device);
    const Tensor staged_in = s.download(in);
    const Tensor staged_out = s.take_elements(out.dtype, mine);
    s.wait_downloads();
    std::vector<StagedWork::Upload> back{{span_of(out, 0, mine), s.at(staged_out)}};
    // A sum of f32 runs as pentad's ring, as Communicator::reduce_scatter_v does on the host.
    if (op == ReduceOp::Sum && in.dtype == DType::F32 && size() > 1)
      return s.posted(ring_reduce_scatter(staged_out, staged_in, counts), std::move(back));
    return s.posted(mpi_->post_reduce_scatter_v(staged_out, staged_in, counts, op),
                    std::move(back));
  }

  std::unique_ptr<WorkImpl> post_all_gather_v(Tensor buf,
                                              std::span<const int64_t> counts) override {
    // Only this rank's block goes down, and only the others' blocks come back up.
    int64_t first = 0;
    for (int r = 0; r < rank(); ++r) first += counts[size_t(r)];
    const int64_t mine = counts[size_t(rank())], after = first + mine;
    Staging s(*this, buf.bytes(), buf.device);
    const Tensor staged = s.take(buf);
    s.download_into(staged, first, span_of(buf, first, mine));
    s.wait_downloads();
    return s.posted(mpi_->post_all_gather_v(staged, counts),
                    {{span_of(buf, 0, first), s.at(staged)},
                     {span_of(buf, after, buf.numel() - after), s.at(staged, after)}});
  }

  std::unique_ptr<WorkImpl> post_all_to_all(Tensor out, const Tensor& in) override {
    Staging s(*this, in.bytes() + out.bytes(), in.device);
    const Tensor staged_in = s.download(in);
    const Tensor staged_out = s.take(out);
    s.wait_downloads();
    return s.posted(mpi_->post_all_to_all(staged_out, staged_in), {{whole(out), s.at(staged_out)}});
  }

  std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor out, std::span<const int64_t> recv_counts,
                                              const Tensor& in,
                                              std::span<const int64_t> send_counts) override {
    // Only the counts' prefixes move: the buffers may be longer.
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size(); ++p) {
      sent += send_counts[size_t(p)];
      received += recv_counts[size_t(p)];
    }
    const size_t element = dtype_bytes(in.dtype);
    Staging s(*this, size_t(sent + received) * element, in.device);
    const Tensor staged_in = s.take_elements(in.dtype, sent);
    s.download_into(staged_in, 0, span_of(in, 0, sent));
    const Tensor staged_out = s.take_elements(out.dtype, received);
    s.wait_downloads();
    return s.posted(mpi_->post_all_to_all_v(staged_out, recv_counts, staged_in, send_counts),
                    {{span_of(out, 0, received), s.at(staged_out)}});
  }

  std::unique_ptr<WorkImpl> post_broadcast(Tensor buf, int root) override {
    const bool is_root = rank() == root;
    Staging s(*this, buf.bytes(), buf.device);
    const Tensor staged = is_root ? s.download(buf) : s.take(buf);
    s.wait_downloads();
    std::vector<StagedWork::Upload> back;
    if (!is_root) back.push_back({whole(buf), s.at(staged)});
    return s.posted(mpi_->post_broadcast(staged, root), std::move(back));
  }

  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
    // One block per op, each given back when its own op is done; every send's download is
    // waited for once, then the batch is posted at once, as the MPI backend posts it.
    std::vector<Staging> stagings;
    stagings.reserve(ops.size());
    std::vector<P2POp> staged_ops = ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      stagings.emplace_back(*this, ops[i].buf.bytes(), ops[i].buf.device);
      staged_ops[i].buf =
          ops[i].is_send ? stagings[i].download(ops[i].buf) : stagings[i].take(ops[i].buf);
    }
    staging_.wait_downloads();
    std::vector<std::unique_ptr<WorkImpl>> posted = mpi_->post_p2p(staged_ops);
    PENTAD_CHECK(posted.size() == ops.size(), "communicator '{}': {} handles for {} p2p ops",
                 name(), posted.size(), ops.size());
    std::vector<std::unique_ptr<WorkImpl>> works;
    for (size_t i = 0; i < ops.size(); ++i) {
      std::vector<StagedWork::Upload> back;
      if (!ops[i].is_send) back.push_back({whole(ops[i].buf), stagings[i].at(staged_ops[i].buf)});
      works.push_back(stagings[i].posted(std::move(posted[i]), std::move(back)));
    }
    return works;
  }

  std::unique_ptr<WorkImpl> post_barrier() override {
    // Every kernel and copy issued before it, once this communicator has moved device
    // tensors (a CPU run on a GPU machine creates no CUDA context here).
    if (device_used_) device_synchronize();
    return mpi_->post_barrier();
  }

 private:
  // One operation's block of staging: tensors laid out in it one after another (each at a
  // 256-byte boundary), given back to the pool unless posted() hands it to a StagedWork.
  class Staging {
   public:
    // device: where the operation's tensors are (page-locked staging for a device only).
    Staging(StagedCommunicator& comm, size_t bytes, Device device)
        : comm_(comm),
          staging_(comm.staging_),
          block_(static_cast<char*>(staging_.acquire(bytes + 256 * 3, device != Device::CPU))),
          capacity_(bytes + 256 * 3) {}
    ~Staging() { release_quietly(staging_, block_); }
    Staging(Staging&& other) noexcept
        : comm_(other.comm_),
          staging_(other.staging_),
          block_(std::exchange(other.block_, nullptr)),
          used_(other.used_),
          capacity_(other.capacity_) {}
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    Staging& operator=(Staging&&) = delete;

    // Room for a host tensor of n elements (contents undefined).
    Tensor take_elements(DType dtype, int64_t n) {
      const size_t bytes = size_t(n) * dtype_bytes(dtype);
      PENTAD_CHECK(used_ + bytes <= capacity_, "staging: {} + {} bytes in a block of {}", used_,
                   bytes, capacity_);
      Tensor t = view_of(block_ + used_, Shape{n}, dtype, Device::CPU);
      used_ += (bytes + 255) / 256 * 256;
      return t;
    }
    Tensor take(const Tensor& like) {
      comm_.device_used_ = comm_.device_used_ || like.device != Device::CPU;
      return take_elements(like.dtype, like.numel());
    }
    // A host copy of t (queued; valid after wait_downloads()).
    Tensor download(const Tensor& t) {
      const Tensor staged = take(t);
      download_into(staged, 0, whole(t));
      return staged;
    }
    void download_into(const Tensor& staged, int64_t first, StagedSpan from) {
      comm_.device_used_ = comm_.device_used_ || from.device != Device::CPU;
      staging_.download(at(staged, first), from.data, from.device, from.bytes);
    }
    void wait_downloads() { staging_.wait_downloads(); }
    char* at(const Tensor& staged, int64_t first = 0) const {
      return static_cast<char*>(staged.data) + size_t(first) * dtype_bytes(staged.dtype);
    }
    // The operation is posted: the block now belongs to its Work.
    std::unique_ptr<WorkImpl> posted(std::unique_ptr<WorkImpl> work,
                                     std::vector<StagedWork::Upload> uploads) {
      return std::make_unique<StagedWork>(staging_, std::exchange(block_, nullptr), std::move(work),
                                          std::move(uploads));
    }

   private:
    StagedCommunicator& comm_;
    HostStaging& staging_;
    char* block_;
    size_t used_ = 0, capacity_ = 0;
  };

  // pentad's rings on the staged copies, over the MPI communicator; their tag is this
  // operation's sequence number, as if this communicator ran them (ring_all_reduce.cpp).
  std::unique_ptr<WorkImpl> ring_all_reduce(Tensor staged) {
    mpi_->next_seq_ = next_seq_;
    return mpi_->post_ring_all_reduce(staged);
  }
  std::unique_ptr<WorkImpl> ring_reduce_scatter(Tensor out, const Tensor& in,
                                                std::span<const int64_t> counts) {
    mpi_->next_seq_ = next_seq_;
    return mpi_->post_ring_reduce_scatter(out, in, counts);
  }

  std::unique_ptr<Communicator> mpi_;  // same ranks, same order; moves the staging
  HostStaging staging_;
  bool device_used_ = false;  // a device tensor has passed: barrier() waits for the device
};

std::unique_ptr<Communicator> make_staged_communicator(MPI_Comm comm, std::string name) {
  return std::make_unique<StagedCommunicator>(comm, std::move(name));
}

}  // namespace pentad::parallel
