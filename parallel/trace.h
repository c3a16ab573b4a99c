#pragma once
// Communication trace: every operation of every communicator on this rank, always on.
//
// Each operation writes one CommEvent into a fixed ring buffer (kCommTraceCapacity
// events, allocated once; no allocation per event). `enter_ns` is taken before any
// injected delay and before the operation is posted; `leave_ns` is filled in when the
// operation is first observed complete by Work::test() or Work::wait() (0 while
// pending); NCCL operations, whose wait() does not block the host, are stamped when the
// host first sees their completion event (parallel/comm.h), so their span is an upper
// bound. Times are on the trace clock (trace_now_ns, below).
//
// Fault detection (a hung collective: the newest event with leave_ns == 0 and the
// sequence numbers of the other ranks), tracing and the planner's bandwidth
// measurements read this; so does a person after SIGUSR1.
#include <mpi.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pentad::parallel {

constexpr size_t kCommTraceCapacity = 8192;

enum class CommKind : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  AllToAll,
  AllToAllV,
  Broadcast,
  Send,
  Recv,
  Barrier,
};
const char* comm_kind_name(CommKind kind);

struct CommEvent {
  uint64_t id = 0;       // position in this rank's event stream (0, 1, 2, ...)
  uint32_t comm_id = 0;  // unique per communicator within this process
  char comm_name[32]{};  // the communicator's name (truncated to 31 bytes)
  uint64_t seq = 0;      // per-communicator sequence number, from 0
  CommKind kind = CommKind::AllReduce;
  int peer = -1;      // send/recv peer or broadcast root (rank in the group); -1 otherwise
  int64_t bytes = 0;  // bytes this rank contributes (send side; recv: bytes received)
  int64_t enter_ns = 0;
  int64_t leave_ns = 0;  // 0 while pending

  std::string_view name() const { return comm_name; }
  double seconds() const { return leave_ns ? 1e-9 * double(leave_ns - enter_ns) : 0.0; }
};

// Snapshot of the ring buffer, oldest first (at most kCommTraceCapacity events).
std::vector<CommEvent> comm_events();
// One line per event:
//   "#12 dp[3] seq 7 all_reduce 4.0 KiB peer -1 enter 1.234567 s took 0.000120 s"
void dump_comm_events(std::FILE* out);
// Dump the ring buffer to stderr when `signo` arrives (best effort: no locks taken).
void install_comm_dump_on_signal(int signo = SIGUSR1);
// Forget every event (tests and benchmarks that want a clean window).
void clear_comm_events();

// Completed operations per communicator name (communicators of equal name are summed,
// destroyed ones included). seconds = sum of (leave - enter).
struct CommTotals {
  int64_t bytes = 0;
  int64_t count = 0;
  double seconds = 0;
};
std::map<std::string, CommTotals> comm_totals();
void reset_comm_totals();

// The trace clock: steady_clock ns since the process started, or since align_trace_clock.
int64_t trace_now_ns();
// Gives the ranks of `world` one trace clock, so that one rank's times compare with
// another's (the pipeline timeline's transfers and step windows): the ranks of a machine,
// which share its steady clock, take one zero, the earliest of their exits from a barrier
// of all; machines differ by how far apart they left it. Collective over `world`; once a
// process (later calls, and calls before MPI_Init, return at once). Before it each rank counted
// from its own start: processes that mpirun started milliseconds apart measured transfers
// milliseconds long.
void align_trace_clock(MPI_Comm world);

// ---- used by communicators (parallel/comm.cpp), not by callers ----
struct CommTraceChannel;  // one per communicator: id, name, totals; lives until exit
CommTraceChannel* trace_open_channel(const std::string& name);
struct TraceTicket {
  CommTraceChannel* channel = nullptr;
  uint64_t event_id = 0;
  int64_t bytes = 0;
  int64_t enter_ns = 0;
  uint64_t seq = 0;
  CommKind kind = CommKind::AllReduce;
  int peer = -1;  // send/recv peer (rank in the group); -1 otherwise
};
// A channel's name and its communicator's members (world ranks), which the communicator
// sets once after creating it, before any operation (the fault monitor reports them).
void trace_set_members(CommTraceChannel* channel, std::vector<int> world_ranks);
const char* trace_channel_name(const CommTraceChannel* channel);
std::vector<int> trace_channel_members(const CommTraceChannel* channel);
int trace_channel_member(const CommTraceChannel* channel, int rank);  // its world rank, or -1
TraceTicket trace_enter(CommTraceChannel* channel, uint64_t seq, CommKind kind, int64_t bytes,
                        int peer);
// Stamps leave_ns (unless the ring has overwritten the event) and adds to the totals.
void trace_leave(const TraceTicket& ticket);
// Per communicator name (the newest communicator of a name, members set): the highest
// sequence number of a collective (not a send or receive) this rank has seen complete, -1
// if none. The fault monitor reports it: a rank that has completed a collective is not the
// one holding it up, whatever an older beat of another member says.
std::map<std::string, int64_t> trace_collectives_done();

}  // namespace pentad::parallel
