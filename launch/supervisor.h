#pragma once
// `pentad launch [options] -- LAUNCHER... pentad train RECIPE [args]`: runs a training job
// under supervision, detects a dead, hung or slow rank from what the ranks report of their
// own communication, and restarts the job from its newest checkpoint.
//
// The supervisor is not an MPI process (main() dispatches here before MPI_Init). It listens
// on a TCP port and starts the command with PENTAD_MONITOR=<host>:<port> and
// PENTAD_LAUNCH_ATTEMPT=<n> in its environment. Each rank connects and sends
// newline-delimited JSON, rank -> supervisor only:
//   {"type":"hello","rank","world","pid","host","out_dir","attempt","resume_step",
//    "ckpt_dirs"}  once
//   {"type":"beat","rank","t","step","phase":"compute"|"wait"|"checkpoint"|"other","step_seconds",
//    "wait_seconds","ckpt_step","wait":{"comm","kind","seq","since_s","members"}}  every 100 ms
//     ("wait" only in phase wait; "p2p":[[peer, send_s_per_mb, recv_s_per_mb],...] optional,
//     the rank's row of the link matrix, parallel/activity.h; "done":{comm: seq} optional, the
//     highest collective completed per communicator, parallel/trace.h)
//   {"type":"bye","rank","status":"done"|"error","message","cause"}  at the end
// Events go to stdout, one line each, and as JSON objects to events.jsonl.
//
// Before a restart it waits: backing off when the same cause comes back (restart_policy.h),
// and until the checkpoint directories allow a restart (store_check.h: one gone, or full
// where the saves failed), up to --storage-wait-s, saying so every kNoteSeconds; after a
// host fault, until that host answers again (host_check.h), up to --host-wait-s.
//
// A host whose ranks all fall silent (its link down) is first waited for, up to
// --link-wait-s: if its ranks are heard again and the job moves on, nothing is ended (a link
// that flaps costs its outage, not a restart).
#include <string>
#include <vector>

namespace pentad::launch {

struct LaunchOptions {
  int max_restarts = 3;
  double backoff_s = 2.0, backoff_max_s = 60.0;  // restart_policy.h's first_s and cap_s
  double storage_wait_s = 30.0;                  // for a checkpoint directory to clear
  double link_wait_s = 10.0;  // for an unreachable host to be heard again before ending the job
  double host_wait_s = 60.0;  // for the host of a host fault to answer before a restart
  bool exclude_culprit = false;
  bool replan = false;         // restart on the best layout for the ranks that remain (replan.h)
  std::string replan_cluster;  // the planner's machine for --replan (empty: this one's calibration)
  bool restart_on_slow = false;
  double link_slow_s = 1.0;  // a link slow this long is reported (detector.h)
  // --replan around a slow link: only if the time saved over the steps left is this many
  // times the restart's cost
  double replan_gain = 2.0;
  int port = 0;
  double hang_factor = 5.0, hang_floor_s = 2.0, beat_timeout_s = 1.0;
  std::string events_path;           // empty: <out_dir>/events.jsonl from the ranks' hello
  std::vector<std::string> command;  // after --
};

// argv[0] is "launch". Throws pentad::Error saying what to change on bad input.
LaunchOptions parse_launch_options(int argc, char** argv);

// The whole command: parses, supervises, returns the exit status (0: the job finished).
int supervise_main(int argc, char** argv);

}  // namespace pentad::launch
