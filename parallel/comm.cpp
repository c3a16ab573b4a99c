#include "parallel/comm.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "parallel/activity.h"
#include "parallel/backend.h"

namespace pentad::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::MPI:
      return "mpi";
    case Backend::NCCL:
      return "nccl";
    case Backend::Staged:
      return "staged";
  }
  return "?";
}

bool backend_available(Backend backend) {
  return backend != Backend::NCCL || nccl_compiled();
}

void fail_with_trace(const std::string& message) {
  std::fprintf(stderr, "pentad: %s\n", message.c_str());
  dump_comm_events(stderr);
  throw Error(message);
}

// ---- Work ----

Work::Work() = default;

Work::Work(std::unique_ptr<WorkImpl> impl, TraceTicket ticket)
    : impl_(std::move(impl)), ticket_(ticket) {}

Work::Work(Work&& other) noexcept : impl_(std::move(other.impl_)), ticket_(other.ticket_) {}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    drop();
    impl_ = std::move(other.impl_);
    ticket_ = other.ticket_;
  }
  return *this;
}

Work::~Work() {
  drop();
}

void Work::drop() noexcept {
  if (!impl_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    // Destructors cannot throw; the trace is already on stderr.
    std::fprintf(stderr, "pentad: a dropped pending operation failed: %s\n", e.what());
    impl_.reset();
  }
}

void Work::finish(bool seen_done) {
  // After a wait() on device memory the host has not seen the operation done: its backend
  // stamps the leave time later (comm.h, "Trace times of device operations").
  if (seen_done || !impl_->keep_ticket(ticket_)) {
    trace_leave(ticket_);
    if (ticket_.kind == CommKind::Send || ticket_.kind == CommKind::Recv)  // the link matrix
      activity_link_sample(trace_channel_member(ticket_.channel, ticket_.peer),
                           ticket_.kind == CommKind::Send, ticket_.bytes,
                           1e-9 * double(trace_now_ns() - ticket_.enter_ns));
  }
  impl_.reset();
}

bool Work::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  finish(true);
  return true;
}

void Work::wait() {
  if (!impl_) return;
  activity_wait_begin(ticket_);  // the fault monitor sees this rank blocked here
  try {
    impl_->wait();
  } catch (...) {
    activity_wait_end();
    throw;
  }
  activity_wait_end();
  finish(false);
}

// ---- Communicator: the checks, the trace and the routing every backend shares ----
// (the injected slowness is in comm_injection.cpp)

Communicator::Communicator(std::string name, Backend backend)
    : name_(std::move(name)), backend_(backend), trace_(trace_open_channel(name_)) {}

Communicator::~Communicator() = default;

Device Communicator::device() const {
  return backend_ == Backend::NCCL ? Device::CUDA : Device::CPU;
}

void Communicator::set_host_companion(std::unique_ptr<Communicator> host) {
  PENTAD_CHECK(
      host && host->backend() == Backend::MPI && host->rank() == rank_ && host->size() == size_,
      "communicator '{}': the host companion must be an MPI communicator over the same "
      "ranks",
      name_);
  host_ = std::move(host);
}

std::unique_ptr<WorkImpl> Communicator::post_host_barrier() {
  PENTAD_CHECK(host_, "communicator '{}' has no host companion", name_);
  return host_->post_barrier();
}

void Communicator::check_tensor(const Tensor& t, const char* op, const char* what) const {
  PENTAD_CHECK(t.device == device() || (host_ && t.device == Device::CPU) || stages_everything(),
               "communicator '{}' {}: {} is on {} but the {} backend needs {} tensors", name_, op,
               what, device_name(t.device), backend_name(backend_), device_name(device()));
  PENTAD_CHECK(t.data != nullptr || t.numel() == 0,
               "communicator '{}' {}: {} {} has no memory (a measuring arena?)", name_, op, what,
               t.shape.str());
  if (host_) check_memory(t, op, what);
}

void Communicator::check_same_device(const Tensor& out, const Tensor& in, const char* op) const {
  PENTAD_CHECK(out.device == in.device,
               "communicator '{}' {}: in is on {} but out is on {}; both must be on one device "
               "(copy one of them first)",
               name_, op, device_name(in.device), device_name(out.device));
}

void Communicator::check_peer(int peer, int tag, const char* op) const {
  PENTAD_CHECK(peer >= 0 && peer < size_,
               "communicator '{}' {}: peer {} is not a rank of a group of {}", name_, op, peer,
               size_);
  PENTAD_CHECK(tag >= 0, "communicator '{}' {}: tag {} is negative", name_, op, tag);
}

TraceTicket Communicator::enter(CommKind kind, int64_t bytes, int peer) {
  return trace_enter(trace_, next_seq_++, kind, bytes, peer);
}

Work Communicator::finish(std::unique_ptr<WorkImpl> impl, TraceTicket ticket, bool async) {
  Work work(pump_if_delayed(std::move(impl)), ticket);
  if (!async) work.wait();
  return work;
}

void Communicator::check_pair(const Tensor& out, const Tensor& in, const char* op) const {
  check_same_device(out, in, op);
  check_tensor(out, op, "out");
  check_tensor(in, op, "in");
  PENTAD_CHECK(out.dtype == in.dtype, "communicator '{}' {}: out is {} but in is {}", name_, op,
               dtype_name(out.dtype), dtype_name(in.dtype));
}

TraceTicket Communicator::enter_injected(CommKind kind, int64_t bytes, int peer) {
  TraceTicket ticket = enter(kind, bytes, peer);
  inject(bytes);
  return ticket;
}

// The preamble every collective shares once its tensors are checked: the backend that moves
// `routed` checks the dtype, the trace takes a ticket, the injected delay runs; then `post`
// posts on that backend.
template <typename Post>
Work Communicator::collective(CommKind kind, const Tensor& routed, bool reduction, int64_t bytes,
                              int peer, bool async, Post post, int64_t model_bytes) {
  Communicator& backend = route(routed);
  backend.check_dtype(routed.dtype, reduction);
  TraceTicket ticket = enter_injected(kind, bytes, peer);
  const double wire_s = simulated_collective_seconds(kind, model_bytes);
  return finish(after_wire_time(post(backend), wire_s), ticket, async);
}

Work Communicator::all_reduce(Tensor buf, ReduceOp op, bool async) {
  check_tensor(buf, "all_reduce", "buf");
  if (ring_all_reduce_ && op == ReduceOp::Sum && buf.dtype == DType::F32 &&
      buf.device == Device::CPU && size_ > 1 && !stages_everything()) {
    TraceTicket ticket = enter_injected(CommKind::AllReduce, int64_t(buf.bytes()), -1);
    return finish(post_ring_all_reduce(buf), ticket, async);
  }
  return collective(
      CommKind::AllReduce, buf, true, int64_t(buf.bytes()), -1, async,
      [&](Communicator& backend) { return backend.post_all_reduce(buf, op); },
      int64_t(buf.bytes()));
}

Work Communicator::reduce_scatter(Tensor out, const Tensor& in, ReduceOp op, bool async) {
  check_pair(out, in, "reduce_scatter");
  PENTAD_CHECK(
      in.numel() == int64_t(size_) * out.numel(),
      "communicator '{}' reduce_scatter: in {} has {} elements but needs size {} x out {} = {}",
      name_, in.shape.str(), in.numel(), size_, out.shape.str(), int64_t(size_) * out.numel());
  return collective(
      CommKind::ReduceScatter, in, true, int64_t(in.bytes()), -1, async,
      [&](Communicator& backend) { return backend.post_reduce_scatter(out, in, op); },
      int64_t(in.bytes()));
}

Work Communicator::all_gather(Tensor out, const Tensor& in, bool async) {
  check_pair(out, in, "all_gather");
  PENTAD_CHECK(
      out.numel() == int64_t(size_) * in.numel(),
      "communicator '{}' all_gather: out {} has {} elements but needs size {} x in {} = {}", name_,
      out.shape.str(), out.numel(), size_, in.shape.str(), int64_t(size_) * in.numel());
  return collective(
      CommKind::AllGather, in, false, int64_t(in.bytes()), -1, async,
      [&](Communicator& backend) { return backend.post_all_gather(out, in); },
      int64_t(out.bytes()));
}

int64_t Communicator::check_counts(std::span<const int64_t> counts, const char* op) const {
  PENTAD_CHECK(counts.size() == size_t(size_), "communicator '{}' {}: {} counts for a group of {}",
               name_, op, counts.size(), size_);
  int64_t total = 0;
  for (int p = 0; p < size_; ++p) {
    PENTAD_CHECK(counts[size_t(p)] >= 0, "communicator '{}' {}: negative count for rank {}", name_,
                 op, p);
    total += counts[size_t(p)];
  }
  return total;
}

Work Communicator::reduce_scatter_v(Tensor out, const Tensor& in, std::span<const int64_t> counts,
                                    ReduceOp op, bool async) {
  check_pair(out, in, "reduce_scatter_v");
  const int64_t total = check_counts(counts, "reduce_scatter_v");
  PENTAD_CHECK(in.numel() == total && out.numel() >= counts[size_t(rank_)],
               "communicator '{}' reduce_scatter_v: in {} must hold the counts' sum {} and out {} "
               "at least this rank's {}",
               name_, in.shape.str(), total, out.shape.str(), counts[size_t(rank_)]);
  // pentad's ring (ring_all_reduce.cpp); the staged backend runs it on its staging itself.
  if (op == ReduceOp::Sum && in.dtype == DType::F32 && in.device == Device::CPU &&
      out.device == Device::CPU && size_ > 1 && !stages_everything()) {
    TraceTicket ticket = enter_injected(CommKind::ReduceScatter, int64_t(in.bytes()), -1);
    return finish(post_ring_reduce_scatter(out, in, counts), ticket, async);
  }
  return collective(
      CommKind::ReduceScatter, in, true, int64_t(in.bytes()), -1, async,
      [&](Communicator& backend) { return backend.post_reduce_scatter_v(out, in, counts, op); },
      int64_t(in.bytes()));
}

Work Communicator::all_gather_v(Tensor buf, std::span<const int64_t> counts, bool async) {
  check_tensor(buf, "all_gather_v", "buf");
  const int64_t total = check_counts(counts, "all_gather_v");
  PENTAD_CHECK(buf.numel() == total,
               "communicator '{}' all_gather_v: buf {} must hold the counts' sum {}", name_,
               buf.shape.str(), total);
  const int64_t mine = counts[size_t(rank_)] * int64_t(dtype_bytes(buf.dtype));
  return collective(
      CommKind::AllGather, buf, false, mine, -1, async,
      [&](Communicator& backend) { return backend.post_all_gather_v(buf, counts); },
      int64_t(buf.bytes()));
}

Work Communicator::all_to_all(Tensor out, const Tensor& in, bool async) {
  check_pair(out, in, "all_to_all");
  PENTAD_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0,
               "communicator '{}' all_to_all: in {} and out {} must have equal element counts "
               "divisible by the group size {}",
               name_, in.shape.str(), out.shape.str(), size_);
  return collective(
      CommKind::AllToAll, in, false, int64_t(in.bytes()), -1, async,
      [&](Communicator& backend) { return backend.post_all_to_all(out, in); }, int64_t(in.bytes()));
}

Work Communicator::all_to_all_v(Tensor out, std::span<const int64_t> recv_counts, const Tensor& in,
                                std::span<const int64_t> send_counts, bool async) {
  check_pair(out, in, "all_to_all_v");
  PENTAD_CHECK(recv_counts.size() == size_t(size_) && send_counts.size() == size_t(size_),
               "communicator '{}' all_to_all_v: {} send and {} receive counts for a group of {}",
               name_, send_counts.size(), recv_counts.size(), size_);
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < size_; ++p) {
    PENTAD_CHECK(send_counts[size_t(p)] >= 0 && recv_counts[size_t(p)] >= 0,
                 "communicator '{}' all_to_all_v: negative count for peer {}", name_, p);
    send_total += send_counts[size_t(p)];
    recv_total += recv_counts[size_t(p)];
  }
  PENTAD_CHECK(send_total <= in.numel(),
               "communicator '{}' all_to_all_v: send counts sum to {} but in {} has {} elements",
               name_, send_total, in.shape.str(), in.numel());
  PENTAD_CHECK(
      recv_total <= out.numel(),
      "communicator '{}' all_to_all_v: receive counts sum to {} but out {} has {} elements", name_,
      recv_total, out.shape.str(), out.numel());
  return collective(
      CommKind::AllToAllV, in, false, send_total * int64_t(dtype_bytes(in.dtype)), -1, async,
      [&](Communicator& backend) {
        return backend.post_all_to_all_v(out, recv_counts, in, send_counts);
      },
      send_total * int64_t(dtype_bytes(in.dtype)));
}

Work Communicator::broadcast(Tensor buf, int root, bool async) {
  check_tensor(buf, "broadcast", "buf");
  check_peer(root, 0, "broadcast");
  return collective(
      CommKind::Broadcast, buf, false, int64_t(buf.bytes()), root, async,
      [&](Communicator& backend) { return backend.post_broadcast(buf, root); },
      int64_t(buf.bytes()));
}

Work Communicator::send(const Tensor& buf, int peer, int tag, bool async) {
  std::vector<P2POp> ops{P2POp{true, buf, peer, tag}};
  std::vector<Work> works = batch_p2p(std::move(ops));
  if (!async) works[0].wait();
  return std::move(works[0]);
}

Work Communicator::recv(Tensor buf, int peer, int tag, bool async) {
  std::vector<P2POp> ops{P2POp{false, buf, peer, tag}};
  std::vector<Work> works = batch_p2p(std::move(ops));
  if (!async) works[0].wait();
  return std::move(works[0]);
}

std::vector<Work> Communicator::batch_p2p(std::vector<P2POp> ops) {
  std::vector<TraceTicket> tickets;
  tickets.reserve(ops.size());
  for (const P2POp& op : ops) {
    const char* kind = op.is_send ? "send" : "recv";
    check_tensor(op.buf, kind, "buf");
    check_peer(op.peer, op.tag, kind);
    route(op.buf).check_dtype(op.buf.dtype, false);
    tickets.push_back(
        enter(op.is_send ? CommKind::Send : CommKind::Recv, int64_t(op.buf.bytes()), op.peer));
  }
  std::vector<std::unique_ptr<WorkImpl>> impls = post_p2p_delayed(ops);
  PENTAD_CHECK(impls.size() == ops.size(), "backend returned {} handles for {} p2p ops",
               impls.size(), ops.size());
  std::vector<Work> works;
  works.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) works.emplace_back(std::move(impls[i]), tickets[i]);
  return works;
}

std::vector<std::unique_ptr<WorkImpl>> Communicator::post_p2p_routed(
    const std::vector<P2POp>& ops) {
  if (!host_) return post_p2p(ops);
  // Host buffers go to the companion and device buffers to this backend, each as one batch
  // posted at once, so a ring exchange mixing the two cannot deadlock either.
  std::vector<P2POp> host_ops, device_ops;
  for (const P2POp& op : ops) (op.buf.device == Device::CPU ? host_ops : device_ops).push_back(op);
  std::vector<std::unique_ptr<WorkImpl>> host_impls, device_impls, impls;
  if (!host_ops.empty()) host_impls = host_->post_p2p(host_ops);
  if (!device_ops.empty()) device_impls = post_p2p(device_ops);
  PENTAD_CHECK(host_impls.size() == host_ops.size() && device_impls.size() == device_ops.size(),
               "backends returned {} + {} handles for {} + {} p2p ops", host_impls.size(),
               device_impls.size(), host_ops.size(), device_ops.size());
  size_t h = 0, d = 0;
  for (const P2POp& op : ops)
    impls.push_back(std::move(op.buf.device == Device::CPU ? host_impls[h++] : device_impls[d++]));
  return impls;
}

void Communicator::barrier() {
  TraceTicket ticket = enter_injected(CommKind::Barrier, 0, -1);
  std::this_thread::sleep_for(
      std::chrono::duration<double>(simulated_collective_seconds(CommKind::Barrier, 0)));
  finish(post_barrier(), ticket, false);
}

// ---- the factory: the one place a backend is chosen ----

std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> local(static_cast<size_t>(size)), global(local.size());
  for (size_t i = 0; i < local.size(); ++i) local[i] = int(i);
  MPI_Group_translate_ranks(group, size, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return global;
}

std::unique_ptr<Communicator> make_communicator(Backend backend, MPI_Comm comm, std::string name) {
  std::unique_ptr<Communicator> made;
  switch (backend) {
    case Backend::MPI:
      made = make_mpi_communicator(comm, std::move(name));
      break;
    case Backend::NCCL:
      made = make_nccl_communicator(comm, std::move(name));
      break;
    case Backend::Staged:
      made = make_staged_communicator(comm, std::move(name));
      break;
  }
  PENTAD_CHECK(made != nullptr, "communicator '{}': unknown backend", name);
  made->set_trace_members(world_ranks_of(comm));  // for the fault monitor's reports
  if (made->backend() == Backend::MPI) {
    const SimulatedNodes nodes = simulated_nodes_from_env();
    made->set_simulated_nodes(nodes);
    static bool told = false;
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (nodes.on() && !told && world_rank == 0)
      spdlog::info(
          "simulated nodes (PENTAD_SIM_NODES): {} ranks a node; between nodes +{:.0f} us and "
          "{:.3g} GB/s a transfer",
          nodes.ranks_per_node, nodes.latency_s * 1e6, nodes.bytes_per_second * 1e-9);
    told = told || nodes.on();
  }
  return made;
}

}  // namespace pentad::parallel
