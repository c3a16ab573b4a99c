#pragma once
// The one communicator interface. Every collective and point-to-point transfer in pentad
// goes through a Communicator; the backend (MPI on host memory, NCCL on device memory) is
// chosen once, by make_communicator(), and no caller needs to know which it got.
//
// Every operation:
//   - checks its tensors at the door (device, dtype, sizes; a mismatch is a bug in the
//     caller and fails PENTAD_CHECK with the sizes involved),
//   - gets the next sequence number of its communicator and is recorded in the trace
//     (parallel/trace.h) with its bytes and enter time,
//   - applies the injected delay, if any (set_injection),
//   - is posted non-blocking; async = false waits before returning, async = true returns
//     a pending Work that the caller test()s or wait()s. Buffers must stay untouched
//     until then. Dropping a pending Work waits for it.
// One thread issues a communicator's operations (the sequence numbers assume it); Works
// may be tested from that thread only. Tensors have no strides, so every tensor is
// contiguous. Ranks are 0..size()-1 within the group.
//
// Host and device tensors. An MPI communicator takes host (CPU) tensors only. A staged
// communicator (parallel/staged_comm.cpp) takes tensors of any device and moves them through
// host memory with an MPI communicator's collectives: for several ranks on one GPU, or a
// build without NCCL. An NCCL
// communicator takes both: device tensors go to NCCL, host tensors (a loss sum in a
// double, a flag) to an MPI companion over the same ranks in the same order, so callers
// never pick a communicator by device. Both kinds share one sequence, one trace channel
// and one injection. All tensors of one operation must be on one device (the tensors of
// one batch_p2p may differ: each op goes to its own backend).
//
// Stream rule (NCCL). Kernels run on the legacy default stream (the compute stream,
// kernels/cuda/cuda_ops.h). Each NCCL communicator runs its operations on its own stream,
// created cudaStreamNonBlocking so that nothing orders it implicitly; events order the two:
//   - before each operation (or group), an event recorded on the compute stream, which the
//     communication stream waits for: the operation sees every kernel and copy issued
//     before it;
//   - after it, a completion event on the communication stream. Work::test() queries it;
//     Work::wait() (and so every synchronous call) makes the compute stream wait for it
//     and returns without blocking the host: later kernels, and cudaMemcpy to the host
//     (which runs on the compute stream and blocks), see the result. Code that reads
//     device memory through another stream orders itself after the compute stream
//     (AsyncCopier::begin_after_compute) after the wait.
//   - barrier() blocks the host until every kernel, copy and operation this rank issued
//     before it has finished on the device, then until every rank has reached it.
//   - Host tensors are plain MPI: a synchronous call or wait() returns once the data is
//     in place.
// Trace times of device operations: enter_ns is when the host enqueued the operation;
// leave_ns is when the host first saw its completion event done (Work::test(), or the
// communicator's poll at each of its later operations, waits and barriers), so the span is
// an upper bound that includes queueing behind earlier kernels. An operation hung on the
// device stays PENDING in the trace. NCCL's asynchronous errors are checked at the same
// polls and thrown (with the trace dumped) from the next call on the communicator.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/trace.h"

namespace pentad::parallel {

enum class ReduceOp { Sum, Max, Min };
enum class Backend { MPI, NCCL, Staged };
const char* reduce_op_name(ReduceOp op);
const char* backend_name(Backend backend);
bool backend_available(Backend backend);  // NCCL: only in builds with CUDA and NCCL

class WorkImpl;  // backend-specific: an MPI request, a CUDA event (parallel/backend.h)

// Handle of a possibly non-blocking operation. Default-constructed = already complete.
class Work {
 public:
  Work();
  Work(std::unique_ptr<WorkImpl> impl, TraceTicket ticket);
  Work(Work&& other) noexcept;
  Work& operator=(Work&& other) noexcept;  // waits for the operation it replaces
  ~Work();                                 // waits if still pending

  bool test();  // true once complete; the first true stamps the trace's leave time
  void wait();  // blocks until complete (device memory: see "Stream rule"); again: a no-op
  bool done() const { return impl_ == nullptr; }

 private:
  // Stamps the trace's leave time, or lets the backend do it once the host sees it done.
  void finish(bool seen_done);
  void drop() noexcept;  // waits, reporting (not throwing) a failure
  std::unique_ptr<WorkImpl> impl_;
  TraceTicket ticket_;
};

struct P2POp {
  bool is_send = true;
  Tensor buf;
  int peer = 0;
  int tag = 0;
};

// A slow link or a slow rank, simulated, for tests and benchmarks of slowness. On a matching
// rank, a collective first sleeps delay_seconds plus bytes / bytes_per_second (a slow rank);
// a send is delivered that much later without blocking the sender (a slow outgoing link:
// it is posted once due, messages to one peer one after another, in order).
// Deferred sends are posted when any of this communicator's Works is tested or waited
// (parallel/comm_injection.cpp).
// With link_peer set (links_only too), only the link between slow_rank and link_peer is
// slow: sends from either end to the other are late, every other send is on time.
struct Injection {
  double delay_seconds = 0;
  int slow_rank = -1;           // rank within this communicator; -1: every rank
  double bytes_per_second = 0;  // 0: unlimited
  bool links_only = false;      // slow sends only; collectives run at full speed
  int link_peer = -1;           // rank within this communicator; -1: every peer of slow_rank
};

// Simulated nodes, so that one machine shows a cluster's uneven links (PENTAD_SIM_NODES =
// "R:LAT_US:GBS"): world ranks r and s are on one node iff r / R == s / R, and every transfer
// between two nodes costs LAT_US microseconds more plus bytes / (GBS * 1e9) seconds. A send
// to another node is delivered that much later (as an Injection's slow link); a collective
// whose group spans nodes completes, on every rank of the group, no sooner than the time its
// traffic between nodes would take (comm_injection.cpp gives the model): wire time, which an
// asynchronous collective spends behind the caller's computation, as on a real network.
// make_communicator applies it to every MPI communicator; NCCL communicators run at the
// hardware's speed.
struct SimulatedNodes {
  int ranks_per_node = 0;       // 0: off
  double latency_s = 0;         // added to each transfer between nodes
  double bytes_per_second = 0;  // of a link between nodes
  bool on() const { return ranks_per_node > 0; }
};
// "R:LAT_US:GBS" (empty: off); pentad::Error naming PENTAD_SIM_NODES if malformed.
SimulatedNodes parse_simulated_nodes(const std::string& text);
SimulatedNodes simulated_nodes_from_env();  // PENTAD_SIM_NODES, read at each call

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  Backend backend() const { return backend_; }
  // The backend's own device: CPU for MPI, CUDA for NCCL (which takes host tensors too),
  // CPU for staged (its memory is host memory; it takes tensors of every device).
  Device device() const;

  // In place: every rank ends with op over all ranks' buf.
  Work all_reduce(Tensor buf, ReduceOp op = ReduceOp::Sum, bool async = false);
  // in has size() * out.numel() elements; rank r gets block r of the reduction.
  Work reduce_scatter(Tensor out, const Tensor& in, ReduceOp op = ReduceOp::Sum,
                      bool async = false);
  // out (size() * in.numel() elements) = every rank's in, concatenated in rank order.
  Work all_gather(Tensor out, const Tensor& in, bool async = false);
  // Uneven blocks, counts in elements, one per rank, packed in rank order (displacement =
  // prefix sum); zero counts are fine. reduce_scatter_v: in holds the sum of the counts,
  // and out (at least counts[rank()] elements) gets block rank() of the reduction; a sum of
  // f32 host memory runs as pentad's ring (ring_all_reduce.cpp: two slices of at most 4 MiB
  // as scratch on every rank, each leg timed per peer for the link matrix), others as the
  // backend's.
  // all_gather_v is in place: buf holds the sum of the counts, each rank's own block
  // already where it belongs, and every rank ends with all of them (ZeRO's buckets).
  Work reduce_scatter_v(Tensor out, const Tensor& in, std::span<const int64_t> counts,
                        ReduceOp op = ReduceOp::Sum, bool async = false);
  Work all_gather_v(Tensor buf, std::span<const int64_t> counts, bool async = false);
  // Equal splits: block p of in goes to rank p, block p of out came from rank p.
  Work all_to_all(Tensor out, const Tensor& in, bool async = false);
  // Counts in elements, one per peer; blocks are packed in rank order (displacement =
  // prefix sum). Zero counts are fine. The buffers may be longer than the counts' sums.
  Work all_to_all_v(Tensor out, std::span<const int64_t> recv_counts, const Tensor& in,
                    std::span<const int64_t> send_counts, bool async = false);
  Work broadcast(Tensor buf, int root, bool async = false);
  Work send(const Tensor& buf, int peer, int tag = 0, bool async = false);
  Work recv(Tensor buf, int peer, int tag = 0, bool async = false);
  // Every op posted at once (a ring exchange cannot deadlock); one pending Work per op.
  std::vector<Work> batch_p2p(std::vector<P2POp> ops);
  void barrier();

  void set_injection(const Injection& injection);
  // Sum all-reduces of f32 host tensors run as pentad's ring over send/recv (ring_all_reduce.cpp)
  // instead of the backend's own, so that each leg is timed per peer for the fault monitor's
  // link matrix (parallel/activity.h). Other all-reduces keep the backend's.
  void set_ring_all_reduce(bool on) { ring_all_reduce_ = on; }
  std::vector<int> world_ranks() const { return trace_channel_members(trace_); }
  // Its ranks as world ranks, for the trace (make_communicator sets them).
  void set_trace_members(std::vector<int> world_ranks) {
    trace_set_members(trace_, std::move(world_ranks));
  }
  const Injection& injection() const { return injection_; }
  // Simulated nodes over this communicator's world ranks (set them first: make_communicator
  // does both). Collective: every rank of the group must set the same.
  void set_simulated_nodes(const SimulatedNodes& nodes);

 protected:
  Communicator(std::string name, Backend backend);

  // Backend hooks, called after the checks, the trace record and the injected delay.
  virtual void check_dtype(DType dtype, bool reduction) const = 0;  // pentad::Error if not
  virtual std::unique_ptr<WorkImpl> post_all_reduce(Tensor buf, ReduceOp op) = 0;
  virtual std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor out, const Tensor& in,
                                                        ReduceOp op) = 0;
  virtual std::unique_ptr<WorkImpl> post_all_gather(Tensor out, const Tensor& in) = 0;
  virtual std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor out, const Tensor& in,
                                                          std::span<const int64_t> counts,
                                                          ReduceOp op) = 0;
  virtual std::unique_ptr<WorkImpl> post_all_gather_v(Tensor buf,
                                                      std::span<const int64_t> counts) = 0;
  virtual std::unique_ptr<WorkImpl> post_all_to_all(Tensor out, const Tensor& in) = 0;
  virtual std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor out,
                                                      std::span<const int64_t> recv_counts,
                                                      const Tensor& in,
                                                      std::span<const int64_t> send_counts) = 0;
  virtual std::unique_ptr<WorkImpl> post_broadcast(Tensor buf, int root) = 0;
  // Returns one WorkImpl per op, in order.
  virtual std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) = 0;
  virtual std::unique_ptr<WorkImpl> post_barrier() = 0;
  // Called for every tensor of a communicator with a host companion, after the device
  // checks: a backend may check that the memory really is where the tensor says.
  virtual void check_memory(const Tensor&, const char* /*op*/, const char* /*what*/) const {}

  // A device backend's MPI companion (same ranks, same order): operations on host tensors
  // are posted to it, with this communicator's checks, sequence, trace and injection.
  void set_host_companion(std::unique_ptr<Communicator> host);
  std::unique_ptr<WorkImpl> post_host_barrier();  // the companion's barrier

  int rank_ = 0;  // set by the backend's constructor
  int size_ = 1;

 private:
  TraceTicket enter(CommKind kind, int64_t bytes, int peer);
  TraceTicket enter_injected(CommKind kind, int64_t bytes, int peer);  // enter, then inject
  template <typename Post>
  Work collective(CommKind kind, const Tensor& routed, bool reduction, int64_t bytes, int peer,
                  bool async, Post post, int64_t model_bytes);

  // Injected slowness (comm_injection.cpp).
  void inject(int64_t bytes) const;
  // 0 on ranks the injection spares; peer -1: to any peer (is this rank touched at all?).
  double injected_seconds(int64_t bytes, int peer = -1) const;
  // Simulated nodes: the extra seconds of a send to `peer`, and the wire time of a
  // collective of `bytes` (topology.h's convention) that spans nodes (0 if it does not);
  // after_wire_time() makes a posted collective complete no sooner than that time after the
  // simulated link is free (comm_injection.cpp).
  double simulated_link_seconds(int64_t bytes, int peer) const;
  double simulated_collective_seconds(CommKind kind, int64_t bytes) const;
  std::unique_ptr<WorkImpl> after_wire_time(std::unique_ptr<WorkImpl> impl, double seconds);
  // Whether sends may be queued: an injection on this rank, or nodes simulated.
  bool may_defer_sends() const { return injected_seconds(1) > 0 || sim_ring_crossings_ > 0; }
  friend class DeferredSend;
  friend class StagedCommunicator;  // posts on its MPI communicator's hooks and rings
  friend class PumpingWork;
  friend class RingWork;
  std::unique_ptr<WorkImpl> post_ring_all_reduce(Tensor buf);  // ring_all_reduce.cpp
  std::unique_ptr<WorkImpl> post_ring_reduce_scatter(Tensor out, const Tensor& in,
                                                     std::span<const int64_t> counts);
  struct Deferred {  // a send waiting for its simulated link
    P2POp op;
    std::chrono::steady_clock::time_point due;
    std::unique_ptr<WorkImpl>* posted;  // where DeferredSend keeps the real operation
  };
  void post_due_sends(bool wait_for_all);  // posts every due deferred send, in order
  // impl, made to post due sends when tested or waited if this communicator may have any.
  std::unique_ptr<WorkImpl> pump_if_delayed(std::unique_ptr<WorkImpl> impl);
  // post_p2p_routed, with sends on a slow link queued to be posted late.
  std::vector<std::unique_ptr<WorkImpl>> post_p2p_delayed(const std::vector<P2POp>& ops);

  void check_pair(const Tensor& out, const Tensor& in, const char* op) const;   // + same dtype
  int64_t check_counts(std::span<const int64_t> counts, const char* op) const;  // their sum
  void check_tensor(const Tensor& t, const char* op, const char* what) const;
  void check_same_device(const Tensor& out, const Tensor& in, const char* op) const;
  // The backend that moves t: the host companion for host tensors, if any, else this.
  Communicator& route(const Tensor& t) { return host_ && t.device == Device::CPU ? *host_ : *this; }
  // The staged backend takes every device and runs pentad's rings itself, on its staging.
  bool stages_everything() const { return backend_ == Backend::Staged; }
  std::vector<std::unique_ptr<WorkImpl>> post_p2p_routed(const std::vector<P2POp>& ops);
  void check_peer(int peer, int tag, const char* op) const;
  Work finish(std::unique_ptr<WorkImpl> impl, TraceTicket ticket, bool async);

  std::string name_;
  Backend backend_;
  CommTraceChannel* trace_;
  uint64_t next_seq_ = 0;
  Injection injection_;
  bool ring_all_reduce_ = false;
  std::deque<Deferred> deferred_;
  std::vector<std::chrono::steady_clock::time_point> link_free_;  // per peer
  SimulatedNodes sim_;
  std::vector<int> sim_node_;   // simulated node of each group rank; empty: off
  int sim_ring_crossings_ = 0;  // edges i -> i+1 (mod size) of the group's ring between nodes
  std::chrono::steady_clock::time_point sim_link_free_{};  // the last collective's wire time ends
  // A device backend's MPI companion; null for MPI communicators.
  std::unique_ptr<Communicator> host_;
};

// The factory: duplicates `comm` (the communicator owns its own MPI communicator, and for
// NCCL bootstraps its ncclComm over it). Collective over `comm`. Asking for NCCL in a
// build without it throws pentad::Error; the staged backend exists in every build.
// Which backend a job takes: parallel/backend_choice.h.
std::unique_ptr<Communicator> make_communicator(Backend backend, MPI_Comm comm, std::string name);

}  // namespace pentad::parallel
