#include "parallel/comm.h"

#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

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
  return backend == Backend::MPI ? "mpi" : "nccl";
}

bool backend_available(Backend backend) {
  return backend == Backend::MPI || nccl_compiled();
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
  if (seen_done || !impl_->keep_ticket(ticket_)) trace_leave(ticket_);
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
  impl_->wait();
  finish(false);
}

// ---- Communicator: the checks, the trace and the injection every backend shares ----

Communicator::Communicator(std::string name, Backend backend)
    : name_(std::move(name)), backend_(backend), trace_(trace_open_channel(name_)) {}

Communicator::~Communicator() = default;

Device Communicator::device() const {
  return backend_ == Backend::MPI ? Device::CPU : Device::CUDA;
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
  PENTAD_CHECK(t.device == device() || (host_ && t.device == Device::CPU),
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

double Communicator::injected_seconds(int64_t bytes) const {
  if (injection_.slow_rank != -1 && injection_.slow_rank != rank_) return 0.0;
  double seconds = injection_.delay_seconds;
  if (injection_.bytes_per_second > 0) seconds += double(bytes) / injection_.bytes_per_second;
  return seconds;
}

void Communicator::inject(int64_t bytes) const {
  if (injection_.links_only) return;
  const double seconds = injected_seconds(bytes);
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// A send on a slow link: the real operation is posted by post_due_sends once its time has come.
class DeferredSend final : public WorkImpl {
 public:
  explicit DeferredSend(Communicator& comm) : comm_(comm) {}
  ~DeferredSend() override {
    if (!posted_) comm_.post_due_sends(true);  // never leave a queued pointer behind
  }
  bool test() override {
    comm_.post_due_sends(false);
    return posted_ && posted_->test();
  }
  void wait() override {
    while (!posted_) {
      comm_.post_due_sends(false);
      if (!posted_) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    posted_->wait();
  }
  bool keep_ticket(const TraceTicket& ticket) override { return posted_->keep_ticket(ticket); }
  std::unique_ptr<WorkImpl>* slot() { return &posted_; }

 private:
  Communicator& comm_;
  std::unique_ptr<WorkImpl> posted_;
};

// Any operation on a communicator with deferred sends: testing or waiting also posts the
// sends that have come due, so two ranks waiting on each other's late sends still progress.
class PumpingWork final : public WorkImpl {
 public:
  PumpingWork(Communicator& comm, std::unique_ptr<WorkImpl> inner)
      : comm_(comm), inner_(std::move(inner)) {}
  bool test() override {
    comm_.post_due_sends(false);
    return inner_->test();
  }
  void wait() override {
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  Communicator& comm_;
  std::unique_ptr<WorkImpl> inner_;
};

void Communicator::post_due_sends(bool wait_for_all) {
  while (!deferred_.empty()) {
    Deferred& d = deferred_.front();
    if (!wait_for_all && std::chrono::steady_clock::now() < d.due) return;
    if (wait_for_all) std::this_thread::sleep_until(d.due);
    std::vector<std::unique_ptr<WorkImpl>> impls = post_p2p_routed({d.op});
    *d.posted = std::move(impls.at(0));
    deferred_.pop_front();
  }
}

Work Communicator::finish(std::unique_ptr<WorkImpl> impl, TraceTicket ticket, bool async) {
  if (injected_seconds(1) > 0 || !deferred_.empty())
    impl = std::make_unique<PumpingWork>(*this, std::move(impl));
  Work work(std::move(impl), ticket);
  if (!async) work.wait();
  return work;
}

Work Communicator::all_reduce(Tensor buf, ReduceOp op, bool async) {
  check_tensor(buf, "all_reduce", "buf");
  Communicator& backend = route(buf);
  backend.check_dtype(buf.dtype, true);
  const int64_t bytes = int64_t(buf.bytes());
  TraceTicket ticket = enter(CommKind::AllReduce, bytes, -1);
  inject(bytes);
  return finish(backend.post_all_reduce(buf, op), ticket, async);
}

Work Communicator::reduce_scatter(Tensor out, const Tensor& in, ReduceOp op, bool async) {
  check_same_device(out, in, "reduce_scatter");
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "in");
  PENTAD_CHECK(out.dtype == in.dtype, "communicator '{}' reduce_scatter: out is {} but in is {}",
               name_, dtype_name(out.dtype), dtype_name(in.dtype));
  PENTAD_CHECK(
      in.numel() == int64_t(size_) * out.numel(),
      "communicator '{}' reduce_scatter: in {} has {} elements but needs size {} x out {} = {}",
      name_, in.shape.str(), in.numel(), size_, out.shape.str(), int64_t(size_) * out.numel());
  Communicator& backend = route(in);
  backend.check_dtype(in.dtype, true);
  const int64_t bytes = int64_t(in.bytes());
  TraceTicket ticket = enter(CommKind::ReduceScatter, bytes, -1);
  inject(bytes);
  return finish(backend.post_reduce_scatter(out, in, op), ticket, async);
}

Work Communicator::all_gather(Tensor out, const Tensor& in, bool async) {
  check_same_device(out, in, "all_gather");
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "in");
  PENTAD_CHECK(out.dtype == in.dtype, "communicator '{}' all_gather: out is {} but in is {}", name_,
               dtype_name(out.dtype), dtype_name(in.dtype));
  PENTAD_CHECK(
      out.numel() == int64_t(size_) * in.numel(),
      "communicator '{}' all_gather: out {} has {} elements but needs size {} x in {} = {}", name_,
      out.shape.str(), out.numel(), size_, in.shape.str(), int64_t(size_) * in.numel());
  Communicator& backend = route(in);
  backend.check_dtype(in.dtype, false);
  const int64_t bytes = int64_t(in.bytes());
  TraceTicket ticket = enter(CommKind::AllGather, bytes, -1);
  inject(bytes);
  return finish(backend.post_all_gather(out, in), ticket, async);
}

Work Communicator::all_to_all(Tensor out, const Tensor& in, bool async) {
  check_same_device(out, in, "all_to_all");
  check_tensor(out, "all_to_all", "out");
  check_tensor(in, "all_to_all", "in");
  PENTAD_CHECK(out.dtype == in.dtype, "communicator '{}' all_to_all: out is {} but in is {}", name_,
               dtype_name(out.dtype), dtype_name(in.dtype));
  PENTAD_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0,
               "communicator '{}' all_to_all: in {} and out {} must have equal element counts "
               "divisible by the group size {}",
               name_, in.shape.str(), out.shape.str(), size_);
  Communicator& backend = route(in);
  backend.check_dtype(in.dtype, false);
  const int64_t bytes = int64_t(in.bytes());
  TraceTicket ticket = enter(CommKind::AllToAll, bytes, -1);
  inject(bytes);
  return finish(backend.post_all_to_all(out, in), ticket, async);
}

Work Communicator::all_to_all_v(Tensor out, std::span<const int64_t> recv_counts, const Tensor& in,
                                std::span<const int64_t> send_counts, bool async) {
  check_same_device(out, in, "all_to_all_v");
  check_tensor(out, "all_to_all_v", "out");
  check_tensor(in, "all_to_all_v", "in");
  PENTAD_CHECK(out.dtype == in.dtype, "communicator '{}' all_to_all_v: out is {} but in is {}",
               name_, dtype_name(out.dtype), dtype_name(in.dtype));
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
  Communicator& backend = route(in);
  backend.check_dtype(in.dtype, false);
  const int64_t bytes = send_total * int64_t(dtype_bytes(in.dtype));
  TraceTicket ticket = enter(CommKind::AllToAllV, bytes, -1);
  inject(bytes);
  return finish(backend.post_all_to_all_v(out, recv_counts, in, send_counts), ticket, async);
}

Work Communicator::broadcast(Tensor buf, int root, bool async) {
  check_tensor(buf, "broadcast", "buf");
  check_peer(root, 0, "broadcast");
  Communicator& backend = route(buf);
  backend.check_dtype(buf.dtype, false);
  const int64_t bytes = int64_t(buf.bytes());
  TraceTicket ticket = enter(CommKind::Broadcast, bytes, root);
  inject(bytes);
  return finish(backend.post_broadcast(buf, root), ticket, async);
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
  int64_t total_bytes = 0;
  std::vector<TraceTicket> tickets;
  tickets.reserve(ops.size());
  for (const P2POp& op : ops) {
    const char* kind = op.is_send ? "send" : "recv";
    check_tensor(op.buf, kind, "buf");
    check_peer(op.peer, op.tag, kind);
    route(op.buf).check_dtype(op.buf.dtype, false);
    const int64_t bytes = int64_t(op.buf.bytes());
    total_bytes += bytes;
    tickets.push_back(enter(op.is_send ? CommKind::Send : CommKind::Recv, bytes, op.peer));
  }
  // Sends on a slow link are delivered late (queued, in order per peer); the rest go now.
  std::vector<std::unique_ptr<WorkImpl>> impls;
  if (injected_seconds(1) > 0) {
    link_free_.resize(size_t(size_), std::chrono::steady_clock::time_point{});
    std::vector<P2POp> now_ops;
    std::vector<size_t> now_index;
    impls.resize(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].is_send) {
        now_ops.push_back(ops[i]);
        now_index.push_back(i);
        continue;
      }
      const auto seconds = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(injected_seconds(int64_t(ops[i].buf.bytes()))));
      auto& free = link_free_[size_t(ops[i].peer)];
      free = std::max(free, std::chrono::steady_clock::now()) + seconds;
      auto deferred = std::make_unique<DeferredSend>(*this);
      deferred_.push_back(Deferred{ops[i], free, deferred->slot()});
      impls[i] = std::move(deferred);
    }
    std::vector<std::unique_ptr<WorkImpl>> posted = post_p2p_routed(now_ops);
    for (size_t j = 0; j < posted.size(); ++j)
      impls[now_index[j]] = std::make_unique<PumpingWork>(*this, std::move(posted[j]));
  } else {
    impls = post_p2p_routed(ops);
    if (!deferred_.empty())
      for (auto& impl : impls) impl = std::make_unique<PumpingWork>(*this, std::move(impl));
  }
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
  TraceTicket ticket = enter(CommKind::Barrier, 0, -1);
  inject(0);
  finish(post_barrier(), ticket, false);
}

// ---- the factory: the one place a backend is chosen ----

std::unique_ptr<Communicator> make_communicator(Backend backend, MPI_Comm comm, std::string name) {
  switch (backend) {
    case Backend::MPI:
      return make_mpi_communicator(comm, std::move(name));
    case Backend::NCCL:
      return make_nccl_communicator(comm, std::move(name));
  }
  fail("communicator '{}': unknown backend", name);
}

}  // namespace pentad::parallel
