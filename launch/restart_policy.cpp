#include "launch/restart_policy.h"

#include <algorithm>
#include <cmath>

namespace pentad::launch {

double RestartPolicy::base_wait_s(const BackoffOptions& options, int n) {
  if (n <= 1) return 0;
  // 2^(n-2) overflows nothing: the cap is reached long before.
  const double doubled = options.first_s * std::ldexp(1.0, std::min(n - 2, 60));
  return std::min(options.cap_s, doubled);
}

RestartPolicy::Decision RestartPolicy::failed(const std::string& cause, int64_t step,
                                              int64_t unseen_steps) {
  ++in_a_row_;
  same_cause_ = cause == cause_ ? same_cause_ + 1 : 1;
  cause_ = cause;
  reached_ = std::max(reached_, step + std::max<int64_t>(0, unseen_steps));
  Decision d;
  d.in_a_row = in_a_row_;
  d.same_cause = same_cause_;
  d.past_step = reached_;
  d.give_up = in_a_row_ > o_.max_restarts;
  if (d.give_up) return d;
  const double base = base_wait_s(o_, same_cause_);
  // Drawn for every restart, waiting or not, so that the schedule depends on the seed and
  // the restart's place alone.
  const double factor = std::uniform_real_distribution<double>(1 - o_.jitter, 1 + o_.jitter)(rng_);
  d.wait_s = base * factor;
  return d;
}

bool RestartPolicy::progressed(int64_t step) {
  if (in_a_row_ == 0 || step < reached_ + kClearSteps) return false;
  in_a_row_ = 0;
  same_cause_ = 0;
  cause_.clear();
  reached_ = -1;
  return true;
}

}  // namespace pentad::launch
