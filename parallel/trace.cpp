#include "parallel/trace.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

namespace pentad::parallel {

struct CommTraceChannel {
  uint32_t id = 0;
  char name[32]{};
  CommTotals totals;             // guarded by the trace mutex
  std::vector<int> members;      // world ranks; set before the channel's first operation
  int64_t collective_done = -1;  // the highest seq of a collective completed; trace mutex
};

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The trace clock's zero on the steady clock: this process's start until align_trace_clock.
std::atomic<int64_t> trace_zero_ns{steady_ns()};

// One per process. The ring is static storage so recording never allocates; the mutex
// is uncontended in the common case (one thread issuing communication).
struct TraceState {
  std::mutex mutex;
  CommEvent ring[kCommTraceCapacity];
  std::atomic<uint64_t> next_id{0};   // events ever recorded; slot = id % capacity
  std::atomic<uint64_t> first_id{0};  // clear_comm_events() moves the window start here
  std::vector<std::unique_ptr<CommTraceChannel>> channels;
};

TraceState& state() {
  static TraceState* s = new TraceState();  // never destroyed: usable during exit and signals
  return *s;
}

uint64_t window_begin(const TraceState& s, uint64_t end) {
  const uint64_t oldest_kept = end > kCommTraceCapacity ? end - kCommTraceCapacity : 0;
  return std::max(oldest_kept, s.first_id.load(std::memory_order_acquire));
}

void copy_name(char (&dst)[32], const char* src) {
  std::strncpy(dst, src, sizeof(dst) - 1);
  dst[sizeof(dst) - 1] = '\0';
}

// Formats one event into buf; async-signal tolerant (no allocation, no locks).
int format_event(char* buf, size_t size, const CommEvent& e) {
  const double took = e.leave_ns ? 1e-9 * double(e.leave_ns - e.enter_ns) : -1.0;
  const double kib = double(e.bytes) / 1024.0;
  if (took < 0)
    return std::snprintf(
        buf, size, "#%llu %s[%u] seq %llu %s %.1f KiB peer %d enter %.6f s PENDING\n",
        (unsigned long long)e.id, e.comm_name, e.comm_id, (unsigned long long)e.seq,
        comm_kind_name(e.kind), kib, e.peer, 1e-9 * double(e.enter_ns));
  return std::snprintf(buf, size,
                       "#%llu %s[%u] seq %llu %s %.1f KiB peer %d enter %.6f s took %.6f s\n",
                       (unsigned long long)e.id, e.comm_name, e.comm_id, (unsigned long long)e.seq,
                       comm_kind_name(e.kind), kib, e.peer, 1e-9 * double(e.enter_ns), took);
}

void dump_on_signal(int) {
  // Reads the ring without the mutex: a torn event is possible, a deadlock is not.
  TraceState& s = state();
  const uint64_t end = s.next_id.load(std::memory_order_acquire);
  const uint64_t begin = window_begin(s, end);
  char line[256];
  int n = std::snprintf(line, sizeof(line), "pentad: communication trace, %llu events\n",
                        (unsigned long long)(end - begin));
  if (n > 0) (void)!write(STDERR_FILENO, line, size_t(n));
  for (uint64_t id = begin; id < end; ++id) {
    n = format_event(line, sizeof(line), s.ring[id % kCommTraceCapacity]);
    if (n > 0) (void)!write(STDERR_FILENO, line, std::min(size_t(n), sizeof(line) - 1));
  }
}

}  // namespace

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::AllReduce:
      return "all_reduce";
    case CommKind::ReduceScatter:
      return "reduce_scatter";
    case CommKind::AllGather:
      return "all_gather";
    case CommKind::AllToAll:
      return "all_to_all";
    case CommKind::AllToAllV:
      return "all_to_all_v";
    case CommKind::Broadcast:
      return "broadcast";
    case CommKind::Send:
      return "send";
    case CommKind::Recv:
      return "recv";
    case CommKind::Barrier:
      return "barrier";
  }
  return "?";
}

int64_t trace_now_ns() {
  return steady_ns() - trace_zero_ns.load(std::memory_order_relaxed);
}

void align_trace_clock(MPI_Comm world) {
  static bool aligned = false;  // every rank of a job calls this equally often
  int mpi = 0;
  MPI_Initialized(&mpi);
  if (aligned || !mpi) return;
  aligned = true;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Barrier(world);
  const int64_t left = steady_ns();
  int64_t zero = left;
  MPI_Allreduce(&left, &zero, 1, MPI_INT64_T, MPI_MIN, node);
  MPI_Comm_free(&node);
  trace_zero_ns.store(zero, std::memory_order_relaxed);
}

CommTraceChannel* trace_open_channel(const std::string& name) {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  auto channel = std::make_unique<CommTraceChannel>();
  channel->id = static_cast<uint32_t>(s.channels.size());
  copy_name(channel->name, name.c_str());
  s.channels.push_back(std::move(channel));
  return s.channels.back().get();
}

void trace_set_members(CommTraceChannel* channel, std::vector<int> world_ranks) {
  channel->members = std::move(world_ranks);
}

const char* trace_channel_name(const CommTraceChannel* channel) {
  return channel->name;
}

std::vector<int> trace_channel_members(const CommTraceChannel* channel) {
  return channel->members;
}

int trace_channel_member(const CommTraceChannel* channel, int rank) {
  return rank >= 0 && size_t(rank) < channel->members.size() ? channel->members[size_t(rank)] : -1;
}

TraceTicket trace_enter(CommTraceChannel* channel, uint64_t seq, CommKind kind, int64_t bytes,
                        int peer) {
  TraceState& s = state();
  TraceTicket ticket{channel, 0, bytes, trace_now_ns(), seq, kind, peer};
  std::lock_guard lock(s.mutex);
  ticket.event_id = s.next_id.load(std::memory_order_relaxed);
  CommEvent& e = s.ring[ticket.event_id % kCommTraceCapacity];
  e.id = ticket.event_id;
  e.comm_id = channel->id;
  std::memcpy(e.comm_name, channel->name, sizeof(e.comm_name));
  e.seq = seq;
  e.kind = kind;
  e.peer = peer;
  e.bytes = bytes;
  e.enter_ns = ticket.enter_ns;
  e.leave_ns = 0;
  s.next_id.store(ticket.event_id + 1, std::memory_order_release);
  return ticket;
}

void trace_leave(const TraceTicket& ticket) {
  if (!ticket.channel) return;
  TraceState& s = state();
  const int64_t now = std::max(trace_now_ns(), ticket.enter_ns);
  std::lock_guard lock(s.mutex);
  CommEvent& e = s.ring[ticket.event_id % kCommTraceCapacity];
  if (e.id == ticket.event_id && e.leave_ns == 0) e.leave_ns = now;
  if (ticket.kind != CommKind::Send && ticket.kind != CommKind::Recv)
    ticket.channel->collective_done =
        std::max(ticket.channel->collective_done, int64_t(ticket.seq));
  CommTotals& t = ticket.channel->totals;
  t.bytes += ticket.bytes;
  t.count += 1;
  t.seconds += 1e-9 * double(now - ticket.enter_ns);
}

std::map<std::string, int64_t> trace_collectives_done() {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  std::map<std::string, int64_t> done;
  for (const auto& channel : s.channels)  // a later channel of a name replaces an earlier one
    if (!channel->members.empty()) done[channel->name] = channel->collective_done;
  return done;
}

std::vector<CommEvent> comm_events() {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  const uint64_t end = s.next_id.load(std::memory_order_relaxed);
  const uint64_t begin = window_begin(s, end);
  std::vector<CommEvent> events;
  events.reserve(size_t(end - begin));
  for (uint64_t id = begin; id < end; ++id) events.push_back(s.ring[id % kCommTraceCapacity]);
  return events;
}

void dump_comm_events(std::FILE* out) {
  const std::vector<CommEvent> events = comm_events();
  std::fprintf(out, "pentad: communication trace, %zu events\n", events.size());
  char line[256];
  for (const CommEvent& e : events) {
    format_event(line, sizeof(line), e);
    std::fputs(line, out);
  }
  std::fflush(out);
}

void install_comm_dump_on_signal(int signo) {
  state();  // create the state outside the handler
  struct sigaction action {};
  action.sa_handler = dump_on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signo, &action, nullptr);
}

void clear_comm_events() {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  // Event ids keep increasing (a pending ticket must never match a newer event); only
  // the window restarts.
  s.first_id.store(s.next_id.load(std::memory_order_relaxed), std::memory_order_release);
}

std::map<std::string, CommTotals> comm_totals() {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  std::map<std::string, CommTotals> totals;
  for (const auto& channel : s.channels) {
    CommTotals& t = totals[channel->name];
    t.bytes += channel->totals.bytes;
    t.count += channel->totals.count;
    t.seconds += channel->totals.seconds;
  }
  return totals;
}

void reset_comm_totals() {
  TraceState& s = state();
  std::lock_guard lock(s.mutex);
  for (auto& channel : s.channels) channel->totals = CommTotals{};
}

}  // namespace pentad::parallel
