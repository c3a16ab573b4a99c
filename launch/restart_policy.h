#pragma once
// When `pentad launch` restarts a failed job, how long it waits first, and when it gives up.
//
// Failures in a row are those with no progress between them: a restarted job that trains
// kClearSteps past the furthest step any failed attempt may have reached has cleared them,
// and the count starts again from zero. Where that step is known only from beats (a lower
// bound: steps shorter than a beat go unseen before a kill), the caller adds the steps that
// may have gone unseen, so that a fault met at the same step every time never clears.
// --max-restarts bounds the restarts in a row, so a cause that clears costs one restart however
// long it lasted, and one that never does (a fault met at the same step on every attempt) still
// ends the job. Restarts in a row for the same cause back off exponentially, as Kubernetes'
// CrashLoopBackOff does: the first at once (a lone fault costs no time), then first_s, 2 first_s, 4
// first_s, ... up to cap_s, each times a factor drawn from [1 - jitter, 1 + jitter] (jobs that
// failed together do not restart in step). A new cause starts its own schedule; it still counts as
// in a row.
#include <cstdint>
#include <random>
#include <string>

namespace pentad::launch {

struct BackoffOptions {
  int max_restarts = 3;
  double first_s = 2.0;  // the second restart in a row for one cause waits this long
  double cap_s = 60.0;
  double jitter = 0.25;
};

class RestartPolicy {
 public:
  static constexpr int64_t kClearSteps = 3;  // "trains past a few steps"

  RestartPolicy(BackoffOptions options, uint64_t seed) : o_(options), rng_(seed) {}

  struct Decision {
    bool give_up = false;
    int in_a_row = 0;       // failures in a row, this one included
    int same_cause = 0;     // restarts in a row for this cause, this one included
    double wait_s = 0;      // before this restart (0 with give_up)
    int64_t past_step = 0;  // the step a restarted job must get kClearSteps past
  };
  // An attempt failed with `cause` after reaching `step` (the furthest step of any rank),
  // or up to `unseen_steps` more.
  Decision failed(const std::string& cause, int64_t step, int64_t unseen_steps = 0);
  // A running attempt reached `step`. True once, when this clears the failures in a row.
  bool progressed(int64_t step);
  int in_a_row() const { return in_a_row_; }

  // The wait before the n-th restart in a row for one cause (n >= 1), without jitter.
  static double base_wait_s(const BackoffOptions& options, int n);

 private:
  BackoffOptions o_;
  std::mt19937_64 rng_;
  int in_a_row_ = 0, same_cause_ = 0;
  std::string cause_;
  int64_t reached_ = -1;  // furthest step of the failed attempts in a row
};

}  // namespace pentad::launch
