#pragma once
// Fault injection for the fault detector's tests and benchmarks (launch/): the recipe's
// train.inject_nan_grad and train.inject_fault (recipe/config.h), read once, and struck from
// the training step's hooks: before_step() at the step's start (kill, stop, hang, commhang,
// error, slow, slowlink, corrupt), nan_at() for the loss's gradient, stretch_compute() after
// backward (slow). Restarts under `pentad launch` run clean unless PENTAD_INJECT_EVERY_ATTEMPT.
#include <cstdint>
#include <string>

#include "parallel/mesh.h"
#include "recipe/config.h"

namespace pentad {

class FaultInjector {
 public:
  // Refuses (throws) a spec it cannot read, naming the key. mesh: null for one rank;
  // checkpoint_root: where "corrupt" finds the newest checkpoint. cfg must outlive this.
  FaultInjector(const Config& cfg, parallel::Mesh* mesh, int world_rank,
                std::string checkpoint_root);

  // At the start of step (0-based): whatever strikes then on this rank; "slow" makes the
  // compute slow from then on.
  void before_step(int64_t step);
  // Whether this rank's loss gradient is NaN at step (0-based).
  bool nan_at(int64_t step) const { return step + 1 == nan_step_; }
  // After the step's backward on a slowed rank: spins until its compute since start_cpu took
  // the slow factor times as long (a slow device or core works longer; a sleep would look
  // descheduled); whether it did.
  bool stretch_compute(double start_cpu) const;

 private:
  void parse();
  double strike(int64_t step);       // the compute slow-down factor from then on (1: none)
  void inject_slow_link() const;     // slowlink: on every communicator holding both ends
  void corrupt_newest_checkpoint();  // corrupt: once one is committed; then SIGKILL

  const Config& cfg_;
  parallel::Mesh* mesh_ = nullptr;
  int world_rank_ = 0;
  std::string checkpoint_root_;
  // Each the 1-based step it strikes at on this rank (-1: none here).
  int64_t nan_step_ = -1, fault_step_ = -1;
  std::string fault_kind_;
  double fault_factor_ = 3.0;      // slow: compute this many times as long; slowlink: ms of delay
  int link_a_ = -1, link_b_ = -1;  // slowlink: its two world ranks
  bool link_slowed_ = false;       // slowlink: injected
  double slow_factor_ = 1.0;
};

}  // namespace pentad
