// The Trainer's pipeline-parallel parts that are not the step itself: adaptive kFkB and
// the timeline (Chrome trace and measured bubble).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "train/memory_budget.h"
#include "train/trainer.h"

namespace pentad {

namespace pp = parallel::pp;

double Trainer::measure_link_seconds() {
  // Ping-pong one activation over every stage-to-stage link in turn: half the round trip
  // is that link's transfer time. The slowest link paces the pipeline.
  parallel::Communicator& group = mesh_->group(parallel::Axis::PP);
  std::vector<float> buf(size_t(model_->rows() * cfg_.model.d_model), 0.0f);
  const Tensor t = view_of(buf.data(), Shape{int64_t(buf.size())});
  double seconds = 0.0;
  for (int s = 0; s + 1 < pp_size_; ++s) {
    if (pp_rank_ == s) {
      const int64_t start = parallel::trace_now_ns();
      group.send(t, s + 1);
      group.recv(t, s + 1);
      seconds = std::max(seconds, double(parallel::trace_now_ns() - start) * 0.5e-9);
    } else if (pp_rank_ == s + 1) {
      group.recv(t, s);
      group.send(t, s);
    }
  }
  group.all_reduce(view_of(&seconds, Shape{1}, DType::F64), parallel::ReduceOp::Max);
  return seconds;
}

void Trainer::adapt_pipeline_group() {
  parallel::Communicator& group = mesh_->group(parallel::Axis::PP);
  const double link = measure_link_seconds();
  // Every stage's measured pass times and activation bytes per micro-batch (chunk 0).
  std::vector<double> mine = {pipeline_->forward_seconds(), pipeline_->backward_seconds(),
                              double(model_->slot_bytes(0))};
  std::vector<double> all(size_t(3 * pp_size_));
  group.all_gather(view_of(all.data(), Shape{int64_t(all.size())}, DType::F64),
                   view_of(mine.data(), Shape{3}, DType::F64));
  pp::SimCosts costs;
  std::vector<double> slot_bytes;
  for (int s = 0; s < pp_size_; ++s) {
    costs.forward_seconds.push_back(all[size_t(3 * s)]);
    costs.backward_seconds.push_back(all[size_t(3 * s + 1)]);
    slot_bytes.push_back(all[size_t(3 * s + 2)]);
  }
  costs.transfer_seconds = link;
  const double limit = cfg_.parallel.pp_memory_mb > 0
                           ? double(cfg_.parallel.pp_memory_mb) * 1024 * 1024
                           : std::numeric_limits<double>::infinity();
  pp::ScheduleSpec spec = pipeline_->schedule();
  const pp::GroupChoice choice = pp::choose_group(spec, costs, slot_bytes, limit);
  spec.group = choice.group;
  pipeline_->set_schedule(spec);
  if (logs())
    spdlog::info(
        "adaptive kFkB: link {:.2f} ms, forward {:.2f} ms, backward {:.2f} ms per "
        "micro-batch: k = {} (predicted step {:.1f} ms; 1F1B {:.1f} ms)",
        link * 1e3, costs.forward_seconds[0] * 1e3, costs.backward_seconds[0] * 1e3, choice.group,
        choice.step_seconds * 1e3, choice.one_f_one_b_seconds * 1e3);
}

double Trainer::write_timeline(const std::string& path) {
  if (!pipeline_) return -1.0;
  // This rank's spans as rows of 7 int64: kind, micro, chunk, step, start, end, CPU time;
  // step starts as kind -1.
  constexpr int64_t kRow = 7;
  std::vector<int64_t> rows;
  for (const auto& [step, start] : step_starts_)
    rows.insert(rows.end(), {-1, 0, 0, step, start, start, 0});
  for (const pp::Span& s : pipeline_->spans())
    rows.insert(rows.end(),
                {int64_t(s.kind), s.micro, s.chunk, s.step, s.start_ns, s.end_ns, s.cpu_ns});
  // Gathered to world rank 0; int64 values travel as pairs of int32 (the same bytes).
  auto words = [](int64_t* data, int64_t count) {
    return view_of(data, Shape{2 * count}, DType::I32);
  };
  parallel::Communicator& world = mesh_->world();
  const int n = world.size();
  int64_t count = int64_t(rows.size());
  std::vector<int64_t> counts(static_cast<size_t>(n));
  world.all_gather(words(counts.data(), n), words(&count, 1));
  std::vector<int64_t> send_counts(size_t(n), 0), recv_counts(size_t(n), 0);
  send_counts[0] = 2 * count;
  int64_t total = 0;
  if (world_rank_ == 0)
    for (int r = 0; r < n; ++r) recv_counts[size_t(r)] = 2 * counts[size_t(r)];
  for (int64_t c : recv_counts) total += c / 2;
  std::vector<int64_t> gathered(size_t(std::max<int64_t>(total, 1)));
  rows.resize(std::max<size_t>(rows.size(), 1));
  world.all_to_all_v(words(gathered.data(), int64_t(gathered.size())), recv_counts,
                     words(rows.data(), int64_t(rows.size())), send_counts);
  // Spans are wall time: when the ranks' threads outnumber the cores, a rank that waits for
  // a core looks idle, and the measured bubble counts that wait too.
  const NodeShare node = node_share();
  if (world_rank_ != 0) return 0.0;

  nlohmann::json events = nlohmann::json::array();
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < total; i += kRow) origin = std::min(origin, gathered[size_t(i + 4)]);
  // Per step: the earliest start over ranks, the latest pass end, and each rank's busy time.
  struct StepWindow {
    int64_t start = std::numeric_limits<int64_t>::max(), end = 0;
    std::map<int, double> busy;
    double cpu = 0;  // CPU time in passes, all ranks
  };
  std::map<int64_t, StepWindow> windows;
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    const parallel::MeshCoords x = parallel::mesh_coords(mesh_->config(), r);
    events.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args",
          {{"name", fmt::format("rank {} (pp {} dp {} tp {})", r, x[size_t(parallel::Axis::PP)],
                                x[size_t(parallel::Axis::DP)], x[size_t(parallel::Axis::TP)])}}}});
    for (int64_t i = offset; i < offset + counts[size_t(r)]; i += kRow) {
      const int64_t* row = &gathered[size_t(i)];
      StepWindow& w = windows[row[3]];
      if (row[0] < 0) {
        w.start = std::min(w.start, row[4]);
        continue;
      }
      const auto kind = pp::Span::Kind(row[0]);
      const bool pass = kind == pp::Span::Forward || kind == pp::Span::Backward;
      if (pass) {
        w.end = std::max(w.end, row[5]);
        w.busy[r] += double(row[5] - row[4]);
        w.cpu += double(row[6]);
      }
      const std::string name = pass ? fmt::format("{}{}{}", kind == pp::Span::Forward ? "F" : "B",
                                                  row[1], row[2] ? fmt::format(".{}", row[2]) : "")
                                    : pp::span_name(kind);
      events.push_back({{"name", name},
                        {"cat", pp::span_name(kind)},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", double(row[4] - origin) * 1e-3},
                        {"dur", double(row[5] - row[4]) * 1e-3},
                        {"args",
                         {{"step", row[3] + 1},
                          {"micro_batch", row[1]},
                          {"chunk", row[2]},
                          {"cpu_ms", double(row[6]) * 1e-6}}}});
    }
    offset += counts[size_t(r)];
  }
  // Bubble: 1 - mean busy / window, averaged over the recorded steps after the first
  // (warm-up). Assumes the ranks' steady clocks agree, as they do on one machine.
  // The CPU-time bubble counts the cores' time instead: 1 - CPU time in passes / (cores the
  // ranks can use x window). It is the larger one when ranks wait for a core (each other's or
  // another program's) in the middle of a pass.
  const double core_slots =
      double(std::min(node.threads, node.cores)) * std::max(1, n / node.ranks);
  double bubble_sum = 0.0, cpu_bubble_sum = 0.0;
  int steps = 0;
  for (auto it = windows.begin(); it != windows.end(); ++it) {
    if (it == windows.begin() && windows.size() > 1) continue;
    const StepWindow& w = it->second;
    if (w.end <= w.start) continue;
    double busy = 0.0;
    for (const auto& [rank, b] : w.busy) busy += b;
    bubble_sum += 1.0 - busy / (double(n) * double(w.end - w.start));
    cpu_bubble_sum += std::max(0.0, 1.0 - w.cpu / (core_slots * double(w.end - w.start)));
    ++steps;
  }
  const double bubble = steps ? bubble_sum / steps : 0.0;
  const double cpu_bubble = steps ? cpu_bubble_sum / steps : 0.0;
  const pp::ScheduleSpec& spec = pipeline_->schedule();
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"schedule", cfg_.parallel.pp_schedule},
                          {"stages", spec.stages},
                          {"micro_batches", spec.micro_batches},
                          {"virtual_stages", spec.virtual_stages},
                          {"group", spec.group},
                          {"measured_bubble_fraction", bubble},
                          {"ideal_bubble_fraction", pp::ideal_bubble_fraction(spec)},
                          {"cpu_time_bubble_fraction", cpu_bubble},
                          {"threads_on_node", node.threads},
                          {"cores_on_node", node.cores}}}};
  std::ofstream out(path);
  if (!out) fail("cannot write the pipeline trace {}", path);
  out << doc.dump();
  const std::string shared =
      node.threads <= node.cores
          ? ""
          : fmt::format(
                " | oversubscribed: {} ranks ({} compute threads) share {} core{} on this "
                "machine, so the wall-time bubble includes time spent waiting for a core, "
                "not only for other stages",
                node.ranks, node.threads, node.cores, node.cores == 1 ? "" : "s");
  spdlog::info(
      "pipeline trace: {} ({} steps) | bubble measured {:.3f} (wall time; {:.3f} by CPU "
      "time), ideal {:.3f} ({} p={} m={} v={}{}){}",
      path, steps, bubble, cpu_bubble, pp::ideal_bubble_fraction(spec), cfg_.parallel.pp_schedule,
      spec.stages, spec.micro_batches, spec.virtual_stages,
      spec.kind == pp::ScheduleKind::KFKB ? fmt::format(" k={}", spec.group) : "", shared);
  return bubble;
}

}  // namespace pentad
