#pragma once
// Where a step's compute time goes, op by op (`pentad train --op-profile`): every call
// through the door (kernels/door.h run()) between begin_step() and end_step() is timed and
// summed per op name, with its FLOPs where the op counts them (the GEMMs and attention), so
// the table says how far each op family is from the device's peak.
//
// On the CPU a call is timed on the host clock (the kernels run synchronously). On CUDA an
// event is recorded on the compute stream before and after the call, so the time is the
// device's (the host runs ahead); end_step() waits for the step's last event and reads the
// pairs. The device's queue stays full between ops, so the pair around one op spans its
// kernels only, not the host's launch overhead, unless the host falls behind the device,
// which is itself worth seeing: that time is then charged to the op waiting for its launch.
//
// Only the thread that called begin_step() is timed (the trainer's: one host thread drives
// a device, kernels/cuda/cuda_ops.h), and a call made inside a timed call (one op built on
// another) counts once, in the outer one. What the ops leave (communication waits, host
// work, copies) is the step's time outside the ops: report() prints it.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pentad::kernels::op_profile {

struct OpTime {
  std::string op;
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // summed over the calls that counted theirs; 0 where the op counts none
};

struct Profile {
  std::vector<OpTime> ops;  // most time first
  int64_t steps = 0;
  double step_seconds = 0;  // the timed steps' time, summed (the device's on CUDA)
  double op_seconds() const;
};

// Starts timing this thread's calls until end_step(). Not nested. With `cuda` the step's
// time is the device's: from an event recorded now on the compute stream to one recorded at
// end_step(), which waits for it (so the next step starts with the device's queue empty).
void begin_step(bool cuda);
// Stops timing and adds the step and its ops to the profile.
void end_step();
// The profile so far; reset() clears it.
Profile collect();
void reset();

// Whether this thread's calls are being timed: the door's fast path reads it.
bool timing();

// A table of the profile: per op its share of the timed steps, its time a step, calls a
// step, mean per call and, for ops that count FLOPs, the rate; then the time outside the
// ops. `peak_flops` (0: unknown) adds each counted op's fraction of it.
std::string report(const Profile& profile, double peak_flops);
// The profile as JSON (the same figures as report(), unrounded).
std::string to_json(const Profile& profile, double peak_flops);

// Brackets one call through the door (kernels/door.h): times it when timing() and no outer
// call is being timed.
class Scope {
 public:
  Scope(const char* op, bool cuda, double flops);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool entered_ = false;  // counted in this thread's depth
  bool timed_ = false;    // the outer call: timed, from these
  const char* op_;
  bool cuda_;
  double flops_;
  std::chrono::steady_clock::time_point start_;  // CPU
  int start_event_ = -1;                         // CUDA
};

}  // namespace pentad::kernels::op_profile
