#include "parallel/pp/adaptive.h"

#include <algorithm>

#include "core/check.h"
#include "parallel/trace.h"

namespace pentad::parallel::pp {

double measure_link_seconds(Communicator& stages, int64_t elements) {
  std::vector<float> buf(size_t(elements), 0.0f);
  const Tensor t = view_of(buf.data(), Shape{int64_t(buf.size())});
  const int stage = stages.rank();
  double seconds = 0.0;
  for (int s = 0; s + 1 < stages.size(); ++s) {
    if (stage == s) {
      const int64_t start = trace_now_ns();
      stages.send(t, s + 1);
      stages.recv(t, s + 1);
      seconds = std::max(seconds, double(trace_now_ns() - start) * 0.5e-9);
    } else if (stage == s + 1) {
      stages.recv(t, s);
      stages.send(t, s);
    }
  }
  stages.all_reduce(view_of(&seconds, Shape{1}, DType::F64), ReduceOp::Max);
  return seconds;
}

std::vector<StageMeasure> gather_measures(Communicator& stages, const StageMeasure& mine) {
  std::vector<double> own = {mine.forward_seconds, mine.backward_seconds, mine.slot_bytes};
  std::vector<double> all(size_t(3 * stages.size()));
  stages.all_gather(view_of(all.data(), Shape{int64_t(all.size())}, DType::F64),
                    view_of(own.data(), Shape{3}, DType::F64));
  std::vector<StageMeasure> measures(size_t(stages.size()));
  for (size_t s = 0; s < measures.size(); ++s)
    measures[s] = {all[3 * s], all[3 * s + 1], all[3 * s + 2]};
  return measures;
}

std::vector<double> gather_zero_bubble_costs(Communicator& stages, const std::vector<double>& mine,
                                             double link_seconds) {
  std::vector<double> own = mine;  // (the gather's send buffer is not const)
  std::vector<double> costs(own.size() * size_t(stages.size()) + 1);
  stages.all_gather(view_of(costs.data(), Shape{int64_t(costs.size() - 1)}, DType::F64),
                    view_of(own.data(), Shape{int64_t(own.size())}, DType::F64));
  costs.back() = link_seconds;
  return costs;
}

GroupChoice choose_adaptive_group(const ScheduleSpec& spec,
                                  const std::vector<StageMeasure>& measures, double link_seconds,
                                  double limit_bytes) {
  PENTAD_CHECK(int(measures.size()) == spec.stages, "{} stage measures for {} stages",
               measures.size(), spec.stages);
  SimCosts costs;
  std::vector<double> slot_bytes;
  for (const StageMeasure& m : measures) {
    costs.forward_seconds.push_back(m.forward_seconds);
    costs.backward_seconds.push_back(m.backward_seconds);
    slot_bytes.push_back(m.slot_bytes);
  }
  costs.transfer_seconds = link_seconds;
  return choose_group(spec, costs, slot_bytes, limit_bytes);
}

}  // namespace pentad::parallel::pp
