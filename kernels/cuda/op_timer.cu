// The event pool behind op timing (kernels/op_profile.h; declared in cuda_ops.h).
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {
namespace {

// Used by the one host thread that drives the device (cuda_ops.h). Events are made on first
// use and kept: a step's worth is reused every step.
struct EventPool {
  std::vector<cudaEvent_t> events;
  size_t used = 0;
};

EventPool& pool() {
  static EventPool p;
  return p;
}

}  // namespace

int record_timing_event() {
  EventPool& p = pool();
  if (p.used == p.events.size()) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreate(&event), "cudaEventCreate (op timing)");
    p.events.push_back(event);
  }
  const size_t index = p.used++;
  check(cudaEventRecord(p.events[index], stream()), "cudaEventRecord (op timing)");
  return static_cast<int>(index);
}

double timing_event_seconds(int from, int to) {
  EventPool& p = pool();
  PENTAD_CHECK(from >= 0 && to >= 0 && size_t(from) < p.used && size_t(to) < p.used,
               "op timing: events {} and {} were not recorded", from, to);
  check(cudaEventSynchronize(p.events[size_t(to)]), "cudaEventSynchronize (op timing)");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, p.events[size_t(from)], p.events[size_t(to)]),
        "cudaEventElapsedTime (op timing)");
  return double(ms) * 1e-3;
}

void recycle_timing_events() {
  pool().used = 0;
}

}  // namespace pentad::kernels::cuda
