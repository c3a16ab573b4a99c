#pragma once
// Adaptive kFkB (Ada-Grouper): while training, re-chooses the group size k from what the
// pipeline measured (each stage's forward and backward time per micro-batch and the
// activation bytes one micro-batch keeps) and a measured stage-to-stage transfer, by
// simulating every k (schedule.h, choose_group). Knows the stages' communicator and those
// numbers, nothing of the model or the trainer.
#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "parallel/pp/schedule.h"

namespace pentad::parallel::pp {

// What one stage measured, per micro-batch through its first chunk.
struct StageMeasure {
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  double slot_bytes = 0.0;  // activations one micro-batch in flight keeps
};

// Ping-pongs `elements` floats (one activation) over every stage-to-stage link in turn; half
// the round trip is that link's transfer time. Returns the slowest link's, which paces the
// pipeline, on every stage. Collective over `stages` (the pipeline group, rank = stage).
double measure_link_seconds(Communicator& stages, int64_t elements);

// Every stage's measure, in stage order. Collective over `stages`.
std::vector<StageMeasure> gather_measures(Communicator& stages, const StageMeasure& mine);

// The k whose simulated step under these measures is the shortest among those whose peak
// activations fit in limit_bytes on every stage (infinity: no limit); k = 1 when none
// fits. spec.kind is taken as kFkB.
GroupChoice choose_adaptive_group(const ScheduleSpec& spec,
                                  const std::vector<StageMeasure>& measures, double link_seconds,
                                  double limit_bytes);

// The zero-bubble schedules' costs (ScheduleSpec::zb_costs, per stage and chunk): every
// stage's `mine` (Pipeline::pass_seconds: per chunk its forward, B and W) in stage order,
// then link_seconds. Collective over `stages`.
std::vector<double> gather_zero_bubble_costs(Communicator& stages, const std::vector<double>& mine,
                                             double link_seconds);

}  // namespace pentad::parallel::pp
