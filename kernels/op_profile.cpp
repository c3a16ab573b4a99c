// Op timing behind `pentad train --op-profile` (kernels/op_profile.h).
#include "kernels/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"

namespace pentad::kernels::op_profile {
namespace {

using Clock = std::chrono::steady_clock;

// A CUDA call waiting for its events to be read at end_step().
struct Pending {
  const char* op;
  double flops;
  int start_event, end_event;
};

// Touched only by the timing thread (begin_step()'s), and by collect()/reset() between steps.
struct State {
  std::map<std::string, OpTime> ops;
  int64_t steps = 0;
  double step_seconds = 0;
  std::vector<Pending> pending;
  // The step being timed.
  bool cuda = false;
  Clock::time_point start;
  int start_event = -1;
};

State& state() {
  static State s;
  return s;
}

thread_local bool tl_timing = false;
thread_local int tl_depth = 0;  // door calls open on this thread

void add(const char* op, double seconds, double flops) {
  OpTime& row = state().ops[op];
  row.op = op;
  row.calls += 1;
  row.seconds += seconds;
  row.flops += flops;
}

}  // namespace

double Profile::op_seconds() const {
  double total = 0;
  for (const OpTime& row : ops) total += row.seconds;
  return total;
}

bool timing() {
  return tl_timing;
}

void begin_step(bool cuda) {
  PENTAD_CHECK(!tl_timing, "op_profile::begin_step: a step is already being timed");
  tl_timing = true;
  State& s = state();
  s.cuda = kCudaBuilt && cuda;
  if constexpr (kCudaBuilt) {
    if (s.cuda) {
      s.start_event = cuda::record_timing_event();
      return;
    }
  }
  s.start = Clock::now();
}

void end_step() {
  PENTAD_CHECK(tl_timing, "op_profile::end_step without begin_step");
  tl_timing = false;
  State& s = state();
  double seconds = 0;
  if constexpr (kCudaBuilt) {
    if (s.cuda) seconds = cuda::timing_event_seconds(s.start_event, cuda::record_timing_event());
    for (const Pending& p : s.pending)
      add(p.op, cuda::timing_event_seconds(p.start_event, p.end_event), p.flops);
    if (s.cuda || !s.pending.empty()) cuda::recycle_timing_events();
  }
  if (!s.cuda) seconds = std::chrono::duration<double>(Clock::now() - s.start).count();
  s.pending.clear();
  s.steps += 1;
  s.step_seconds += seconds;
}

Profile collect() {
  const State& s = state();
  Profile profile;
  for (const auto& [op, row] : s.ops) profile.ops.push_back(row);
  std::sort(profile.ops.begin(), profile.ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  profile.steps = s.steps;
  profile.step_seconds = s.step_seconds;
  return profile;
}

void reset() {
  PENTAD_CHECK(!tl_timing, "op_profile::reset during a timed step");
  state() = State{};
}

Scope::Scope(const char* op, bool cuda, double flops) : op_(op), cuda_(cuda), flops_(flops) {
  if (!tl_timing) return;
  entered_ = true;
  if (tl_depth++ > 0) return;  // inside a timed call: counted there
  timed_ = true;
  if constexpr (kCudaBuilt) {
    if (cuda) {
      start_event_ = cuda::record_timing_event();
      return;
    }
  }
  start_ = Clock::now();
}

Scope::~Scope() {
  if (!entered_) return;
  --tl_depth;
  if (!timed_) return;
  if constexpr (kCudaBuilt) {
    if (cuda_) {
      // A destructor must not throw: an event that cannot be recorded (the device failed,
      // which the op's own next call reports) drops this call's time.
      try {
        state().pending.push_back({op_, flops_, start_event_, cuda::record_timing_event()});
      } catch (const std::exception&) {
      }
      return;
    }
  }
  add(op_, std::chrono::duration<double>(Clock::now() - start_).count(), flops_);
}

std::string report(const Profile& profile, double peak_flops) {
  const double steps = double(std::max<int64_t>(profile.steps, 1));
  const double step_s = profile.step_seconds / steps;
  auto share = [&](double seconds) {
    return profile.step_seconds > 0 ? seconds / profile.step_seconds : 0.0;
  };
  std::string out = fmt::format(
      "op profile over {} step(s), {:.3f} ms a step\n{:<32} {:>7} {:>11} {:>8} {:>11} {:>11}{}\n",
      profile.steps, step_s * 1e3, "op", "share", "ms a step", "calls", "us a call", "TFLOP/s",
      peak_flops > 0 ? "   of peak" : "");
  for (const OpTime& row : profile.ops) {
    std::string rate = "-";
    std::string of_peak;
    if (row.flops > 0 && row.seconds > 0) {
      const double flops_per_s = row.flops / row.seconds;
      rate = fmt::format("{:.3f}", flops_per_s / 1e12);
      if (peak_flops > 0) of_peak = fmt::format("  {:7.1f}%", 100 * flops_per_s / peak_flops);
    }
    out +=
        fmt::format("{:<32} {:>6.1f}% {:>11.3f} {:>8.1f} {:>11.1f} {:>11}{}\n", row.op,
                    100 * share(row.seconds), row.seconds / steps * 1e3, double(row.calls) / steps,
                    row.calls > 0 ? row.seconds / double(row.calls) * 1e6 : 0.0, rate, of_peak);
  }
  const double outside = profile.step_seconds - profile.op_seconds();
  out += fmt::format(
      "{:<32} {:>6.1f}% {:>11.3f}  (communication waits, host work, copies, launch gaps)\n",
      "outside the ops", 100 * share(outside), outside / steps * 1e3);
  return out;
}

std::string to_json(const Profile& profile, double peak_flops) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpTime& row : profile.ops) {
    nlohmann::json j = {
        {"op", row.op},
        {"calls", row.calls},
        {"seconds", row.seconds},
        {"share", profile.step_seconds > 0 ? row.seconds / profile.step_seconds : 0.0}};
    if (row.flops > 0) {
      j["flops"] = row.flops;
      if (row.seconds > 0) j["flops_per_second"] = row.flops / row.seconds;
      if (row.seconds > 0 && peak_flops > 0)
        j["fraction_of_peak"] = row.flops / row.seconds / peak_flops;
    }
    ops.push_back(std::move(j));
  }
  nlohmann::json doc = {{"steps", profile.steps},
                        {"step_seconds", profile.step_seconds},
                        {"op_seconds", profile.op_seconds()},
                        {"outside_seconds", profile.step_seconds - profile.op_seconds()},
                        {"ops", std::move(ops)}};
  if (peak_flops > 0) doc["peak_flops_per_second"] = peak_flops;
  return doc.dump(2);
}

}  // namespace pentad::kernels::op_profile
