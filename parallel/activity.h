#pragma once
// What this rank is doing now, for the fault monitor (launch/monitor.h), whose thread reads
// it while the training thread writes it, lock-free: whether the rank is blocked in a
// collective (which communicator, its members, sequence number, since when), and how far
// training has come (steps done, the last step's time and the part of it spent blocked,
// the newest committed checkpoint).
//
// Writers: Work::wait() around every blocking wait (parallel/comm.cpp), the trainer at
// each step's end, run start and checkpoint commit. Reader: the monitor thread.
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/trace.h"

namespace pentad::parallel {

struct WaitSnapshot {
  // Outside any collective, blocked on the checkpoint's own work (its file written and
  // synced, the commit) this long; -1: not.
  double checkpoint_s = -1;
  bool waiting = false;
  std::string comm;          // the communicator's name
  const char* kind = "";     // comm_kind_name
  uint64_t seq = 0;          // its sequence number on that communicator
  double since_s = 0;        // how long this rank has been blocked in it
  std::vector<int> members;  // world ranks of the communicator (empty if unknown)
};

struct ProgressSnapshot {
  bool started = false;     // the trainer's run() has begun (after any resume)
  int64_t start_step = 0;   // the step it started from
  int64_t step = 0;         // optimizer steps completed
  double step_seconds = 0;  // the last step's wall time ...
  double wait_seconds = 0;  // ... and the part of it blocked in collectives
  int64_t ckpt_step = -1;   // newest committed checkpoint (-1: none yet)
  // The last few steps, oldest first: (steps done, seconds, seconds blocked). Steps can be
  // shorter than the monitor's beat; the slow-rank rule compares ranks step by step.
  // compute_cpu: the training thread's CPU time in the step outside waits. A rank that the
  // machine deschedules (oversubscribed cores) takes long on the clock but not in CPU
  // time; a rank that is slow at its work takes long in both.
  struct Step {
    int64_t step = 0;
    double seconds = 0, wait_seconds = 0, compute_cpu = 0;
  };
  std::vector<Step> recent;
};

// The per-peer link matrix, this rank's row: the cost of its transfers with each peer, as
// seconds from posting a send (receive) to seeing it complete, per MB. Fed by every leg of a
// ring all-reduce (parallel/ring_all_reduce.cpp) and every point-to-point send and receive
// (pipeline stages, context-parallel rings). A send's time also holds a late receiver, a
// receive's a late sender (and, for operations polled rather than waited, the time to the
// next poll); a slow link lengthens both. So the link from j to i costs about the lesser of
// j's send time to i and i's receive time from j, which is what the detector takes
// (launch/detector.cpp). Traffic inside the backend's own collectives (MPI's all-reduce,
// ZeRO's reduce-scatter) is not seen: the backend does not say which peer it waited for.
struct LinkCost {
  int peer = -1;              // world rank
  double send_s_per_mb = -1;  // median of the last kLinkSamples sends to it (-1: none)
  double recv_s_per_mb = -1;  // ... and receives from it
};
constexpr size_t kLinkSamples = 32;

// Training thread.
void activity_link_sample(int world_peer, bool sent, int64_t bytes, double seconds);
void activity_wait_begin(const TraceTicket& ticket);
void activity_wait_end();
void activity_run_started(int64_t start_step);
void activity_step_done(int64_t steps_done, double step_seconds);
double thread_cpu_seconds();  // the calling thread's CPU time
void activity_checkpoint_committed(int64_t step);
// Between these the training thread blocks on the checkpoint's own work; nested pairs count
// once. A disk that is slow for a while is not a hang (launch/detector.h).
void activity_checkpoint_wait_begin();
void activity_checkpoint_wait_end();
// Any thread.
WaitSnapshot activity_wait();
ProgressSnapshot activity_progress();
std::vector<LinkCost> activity_links();  // peers in increasing order

}  // namespace pentad::parallel
