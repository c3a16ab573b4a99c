// The pipeline timeline (Trainer::write_timeline): every rank's forward, backward and
// transfer-wait spans of the last steps, gathered to world rank 0 into one Chrome-trace JSON
// (opens in Perfetto), with the bubble measured three ways: by the clock, by CPU time, and by
// the schedule replayed with the stages' own compute time.
#include "train/timeline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "plan/memory_budget.h"
#include "train/trainer.h"

namespace pentad {

namespace pp = parallel::pp;
using timeline::Bubbles;
using timeline::kRow;
using timeline::Rows;

namespace {

// Every rank's rows on world rank 0, rank after rank (counts: each rank's values); on other
// ranks `values` is empty. Collective.
Rows gather_rows(parallel::Communicator& world, std::vector<int64_t> rows, bool root) {
  // int64 values travel as pairs of int32 (the same bytes).
  auto words = [](int64_t* data, int64_t count) {
    return view_of(data, Shape{2 * count}, DType::I32);
  };
  const int n = world.size();
  Rows g;
  int64_t count = int64_t(rows.size());
  g.counts.resize(static_cast<size_t>(n));
  world.all_gather(words(g.counts.data(), n), words(&count, 1));
  std::vector<int64_t> send_counts(size_t(n), 0), recv_counts(size_t(n), 0);
  send_counts[0] = 2 * count;
  if (root)
    for (int r = 0; r < n; ++r) recv_counts[size_t(r)] = 2 * g.counts[size_t(r)];
  for (int64_t c : recv_counts) g.total += c / 2;
  g.values.resize(size_t(std::max<int64_t>(g.total, 1)));
  rows.resize(std::max<size_t>(rows.size(), 1));
  world.all_to_all_v(words(g.values.data(), int64_t(g.values.size())), recv_counts,
                     words(rows.data(), int64_t(rows.size())), send_counts);
  return g;
}

// One rank's spans in one step: from its first span's start to its last one's end, the time
// in spans (passes and waits) and its passes. What is left of the stretch is the executor's
// own time between spans (posting transfers, sends, ZeRO's reductions after a pass).
struct RankStretch {
  int64_t first = std::numeric_limits<int64_t>::max(), last = 0;
  double spans = 0;
  int64_t passes = 0;
};

// Per step: the earliest start over ranks, the latest pass end, and each rank's busy time.
struct StepWindow {
  int64_t start = std::numeric_limits<int64_t>::max(), end = 0;
  std::map<int, double> busy;
  std::map<int, RankStretch> stretch;
  double cpu = 0;  // CPU time in passes, all ranks
};

// What the rows say: the trace's events, the step windows, and each stage's chunks' CPU time
// in forward ([0]), backward or B ([1]) and W ([2]) passes (one micro-batch through one
// chunk; stage s's chunk c at s * v + c) over the steps after the first, with their counts.
struct Scan {
  nlohmann::json events = nlohmann::json::array();
  std::map<int64_t, StepWindow> windows;
  std::vector<double> pass_cpu[3], pass_wall[3];
  // Per counted step, per stage: its first rank's passes' wall seconds, in the order run.
  std::map<int64_t, std::vector<std::vector<double>>> timed;
  std::vector<int64_t> passes[3];
  // Per stage: the executor's seconds between spans, over its ranks and counted steps, and
  // the passes they came with.
  std::vector<double> gap_seconds;
  std::vector<int64_t> gap_passes;
  // A transfer's time from its sender's pass end to the end of the receiver's wait for it,
  // over the waits that blocked, 10 us or more (the first pipeline's ranks): the median, in
  // seconds.
  double transfer_seconds = 0;
};

nlohmann::json thread_name(int r, const parallel::MeshCoords& x) {
  return {{"name", "thread_name"},
          {"ph", "M"},
          {"pid", 0},
          {"tid", r},
          {"args",
           {{"name", fmt::format("rank {} (pp {} dp {} tp {})", r, x[size_t(parallel::Axis::PP)],
                                 x[size_t(parallel::Axis::DP)], x[size_t(parallel::Axis::TP)])}}}};
}

// 0: a forward, 1: a backward or its B, 2: a W; -1: a wait.
int pass_kind(pp::Span::Kind kind) {
  switch (kind) {
    case pp::Span::Forward:
      return 0;
    case pp::Span::Backward:
    case pp::Span::BackwardInput:
      return 1;
    case pp::Span::BackwardWeight:
      return 2;
    default:
      return -1;
  }
}

nlohmann::json span_event(const int64_t* row, int r, int64_t origin) {
  const auto kind = pp::Span::Kind(row[0]);
  const int pass = pass_kind(kind);
  const std::string name = pass >= 0 ? fmt::format("{}{}{}", "FBW"[pass], row[1],
                                                   row[2] ? fmt::format(".{}", row[2]) : "")
                                     : pp::span_name(kind);
  return {{"name", name},
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
            {"cpu_ms", double(row[6]) * 1e-6}}}};
}

// Counted (the bubble and the passes' means): the recorded steps after the first (its
// warm-up), and of those the ones run with the lists set at `lists_since` where any were.
Scan scan_rows(const Rows& g, const parallel::MeshConfig& mesh, const pp::ChunkPlacement& placement,
               int64_t lists_since, int n) {
  const int chunks = placement.chunks;
  Scan scan;
  // The first pipeline's sends (pass ends: forward 0, backward or B 1) and waits, keyed by
  // (step, direction, micro-batch, the sender's virtual stage).
  using Key = std::tuple<int64_t, int, int64_t, int>;
  std::map<Key, int64_t> sent;
  std::vector<std::pair<Key, std::pair<int64_t, int64_t>>> waited;
  const std::vector<int64_t>& v = g.values;
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < g.total; i += kRow) origin = std::min(origin, v[size_t(i + 4)]);
  for (int b = 0; b < 3; ++b) {
    scan.pass_cpu[b].resize(size_t(mesh.pp) * size_t(chunks));
    scan.pass_wall[b].resize(size_t(mesh.pp) * size_t(chunks));
    scan.passes[b].resize(size_t(mesh.pp) * size_t(chunks));
  }
  std::set<int64_t> recorded;
  for (int64_t i = 0; i < g.total; i += kRow) recorded.insert(v[size_t(i + 3)]);
  int64_t counted_from = recorded.empty() ? 0 : *recorded.begin() + (recorded.size() > 1);
  if (recorded.lower_bound(lists_since) != recorded.end())
    counted_from = std::max(counted_from, lists_since);
  int64_t offset = 0;
  std::vector<int> first_rank(size_t(mesh.pp), -1);  // of each stage
  for (int r = 0; r < n; ++r) {
    const parallel::MeshCoords x = parallel::mesh_coords(mesh, r);
    const size_t stage = size_t(x[size_t(parallel::Axis::PP)]);
    if (first_rank[stage] < 0) first_rank[stage] = r;
    scan.events.push_back(thread_name(r, x));
    for (int64_t i = offset; i < offset + g.counts[size_t(r)]; i += kRow) {
      const int64_t* row = &v[size_t(i)];
      if (row[0] >= 0) scan.events.push_back(span_event(row, r, origin));
      if (row[3] < counted_from) continue;
      StepWindow& w = scan.windows[row[3]];
      if (row[0] < 0) {
        w.start = std::min(w.start, row[4]);
        continue;
      }
      const int pass = pass_kind(pp::Span::Kind(row[0]));
      if (first_rank[stage] == r) {
        const int vs = placement.virtual_stage(int(stage), int(row[2]));
        const auto kind = pp::Span::Kind(row[0]);
        if (pass == 0 || pass == 1)
          sent[{row[3], pass, row[1], vs}] = row[5];
        else if (kind == pp::Span::WaitInput)
          waited.push_back({{row[3], 0, row[1], vs - 1}, {row[4], row[5]}});
        else if (kind == pp::Span::WaitGrad)
          waited.push_back({{row[3], 1, row[1], vs + 1}, {row[4], row[5]}});
      }
      RankStretch& mine = w.stretch[r];
      mine.first = std::min(mine.first, row[4]);
      mine.last = std::max(mine.last, row[5]);
      mine.spans += double(row[5] - row[4]);
      mine.passes += pass >= 0 ? 1 : 0;
      if (pass >= 0) {
        w.end = std::max(w.end, row[5]);
        w.busy[r] += double(row[5] - row[4]);
        w.cpu += double(row[6]);
        const size_t at = stage * size_t(chunks) + size_t(row[2]);
        scan.pass_cpu[pass][at] += double(row[6]) * 1e-9;
        scan.pass_wall[pass][at] += double(row[5] - row[4]) * 1e-9;
        if (first_rank[stage] == r) {
          auto& timed = scan.timed[row[3]];
          timed.resize(size_t(mesh.pp));
          timed[stage].push_back(double(row[5] - row[4]) * 1e-9);
        }
        ++scan.passes[pass][at];
      }
    }
    offset += g.counts[size_t(r)];
  }
  scan.gap_seconds.assign(size_t(mesh.pp), 0.0);
  scan.gap_passes.assign(size_t(mesh.pp), 0);
  for (const auto& [step, w] : scan.windows)
    for (const auto& [r, x] : w.stretch) {
      if (x.passes == 0) continue;
      const size_t stage = size_t(parallel::mesh_coords(mesh, r)[size_t(parallel::Axis::PP)]);
      scan.gap_seconds[stage] += std::max(0.0, double(x.last - x.first) - x.spans) * 1e-9;
      scan.gap_passes[stage] += x.passes;
    }
  std::vector<double> latencies;
  for (const auto& [key, span] : waited) {
    const auto it = sent.find(key);
    // Blocked: more than 10 us (a wait whose data had come returns in a few).
    if (it == sent.end() || span.second - span.first < 10000) continue;
    latencies.push_back(double(std::max<int64_t>(0, span.second - it->second)) * 1e-9);
  }
  if (!latencies.empty()) {
    std::nth_element(latencies.begin(), latencies.begin() + ptrdiff_t(latencies.size() / 2),
                     latencies.end());
    scan.transfer_seconds = latencies[latencies.size() / 2];
  }
  return scan;
}

// Whether a traced step has every pass of the lists (seconds[s]: stage s's, in order).
bool whole_step(const std::vector<std::vector<double>>& seconds,
                const std::vector<std::vector<pp::Action>>& lists) {
  bool whole = seconds.size() == lists.size();
  for (size_t st = 0; whole && st < lists.size(); ++st)
    whole = seconds[st].size() == lists[st].size();
  return whole;
}

// A replay's bubble, each stage's busy time less the executor gaps its passes carried (gap[s]
// a pass of stage s; empty: none); -1 where it deadlocked.
double bubble_less_gaps(const pp::SimResult& r, const std::vector<std::vector<pp::Action>>& lists,
                        const std::vector<double>& gap) {
  if (r.deadlock || r.step_seconds <= 0) return -1.0;
  double compute = 0;
  for (size_t st = 0; st < r.busy_seconds.size(); ++st)
    compute += r.busy_seconds[st] - (gap.empty() ? 0.0 : double(lists[st].size()) * gap[st]);
  return 1.0 - compute / double(r.busy_seconds.size()) / r.step_seconds;
}

// Each directed link's transfer (from stage a to b at a * stages + b) for replays that add
// each stage's executor gap to its passes: the measured transfer runs from the sender's pass
// end, so the part of it the sender's gap after the pass already covers (posting the send)
// is not counted twice.
std::vector<double> links_after_gaps(double transfer, const std::vector<double>& gap) {
  const size_t p = gap.size();
  std::vector<double> links(p * p);
  for (size_t a = 0; a < p; ++a)
    for (size_t b = 0; b < p; ++b) links[a * p + b] = std::max(0.0, transfer - gap[a]);
  return links;
}

// The replay with the passes' spread: each pass of the lists drawn (seeded) from the first
// pipeline's measured passes of its stage, chunk and kind, plus its stage's executor gap, and
// each transfer the measured median less the sender's gap; the mean bubble over 32 draws (-1: no
// step traced whole). The passes' spread delays the critical path where a late pass holds up a
// stage that waits for it, which replays at the means leave out.
double sampled_replay(const Scan& scan, const pp::ScheduleSpec& spec,
                      const std::vector<std::vector<pp::Action>>& lists,
                      const std::vector<double>& gap) {
  std::map<std::tuple<size_t, int, int>, std::vector<double>> measured;  // (stage, chunk, kind)
  auto kind = [](const pp::Action& a) {
    return a.type == pp::Action::Forward ? 0 : a.type == pp::Action::Weight ? 2 : 1;
  };
  for (const auto& [step, seconds] : scan.timed) {
    if (!whole_step(seconds, lists)) continue;
    for (size_t st = 0; st < lists.size(); ++st)
      for (size_t i = 0; i < lists[st].size(); ++i)
        measured[{st, lists[st][i].chunk, kind(lists[st][i])}].push_back(seconds[st][i]);
  }
  if (measured.empty()) return -1.0;
  std::mt19937_64 draw(1);
  constexpr int kDraws = 32;
  double sum = 0;
  for (int d = 0; d < kDraws; ++d) {
    pp::SimCosts costs;
    costs.forward_seconds.assign(size_t(spec.stages), 0.0);
    costs.backward_seconds.assign(size_t(spec.stages), 0.0);
    costs.link_seconds = links_after_gaps(scan.transfer_seconds, gap);
    costs.timed_seconds.resize(lists.size());
    for (size_t st = 0; st < lists.size(); ++st)
      for (const pp::Action& a : lists[st]) {
        const std::vector<double>& pool = measured.at({st, a.chunk, kind(a)});
        costs.timed_seconds[st].push_back(pool[draw() % pool.size()] + gap[st]);
      }
    const double bubble = bubble_less_gaps(pp::simulate_lists(spec, lists, costs), lists, gap);
    if (bubble < 0) return -1.0;
    sum += bubble;
  }
  return sum / kDraws;
}

// Bubble: 1 - mean busy / window, averaged over the counted steps (scan_rows), on the ranks' one
// trace clock (parallel::align_trace_clock: exact on one machine). The CPU-time bubble counts the
// cores' time instead: 1 - CPU time in passes / (cores the ranks can use x window). It is the
// larger one when ranks wait for a core (each other's or another program's) in the middle of a
// pass. The compute-time bubble replays the schedule with each chunk's mean CPU time a pass; the
// replayed one with its mean wall time, as the clock measured it (what the measured bubble is to
// match: a pass whose rank lost its core is as long to the stage waiting for it); the timed one
// with every pass as long as it took, step by step: what the lists cost without the executor's own
// gaps and transfers, so the measured bubble above it is theirs, and the replayed one below it
// is the passes' spread about their means. The gap replay adds to each pass its stage's mean
// executor time between spans (busy for the stage, not counted as compute) and to each
// transfer the measured median from its sender's pass end to its receiver's wait end: the
// prediction from means with the executor's own time and the transfers in it.
Bubbles measure_bubbles(const Scan& scan, const NodeShare& node, int n,
                        const pp::ScheduleSpec& spec, int stages) {
  const double core_slots =
      double(std::min(node.threads, node.cores)) * std::max(1, n / node.ranks);
  double bubble_sum = 0.0, cpu_bubble_sum = 0.0;
  Bubbles b;
  for (const auto& [step, w] : scan.windows) {
    if (w.end <= w.start) continue;
    double busy = 0.0;
    for (const auto& [rank, time] : w.busy) busy += time;
    bubble_sum += 1.0 - busy / (double(n) * double(w.end - w.start));
    cpu_bubble_sum += std::max(0.0, 1.0 - w.cpu / (core_slots * double(w.end - w.start)));
    ++b.steps;
  }
  b.wall = b.steps ? bubble_sum / b.steps : 0.0;
  b.cpu = b.steps ? cpu_bubble_sum / b.steps : 0.0;
  // A pass's CPU time over the threads a rank computes with: its time on cores of its own.
  const double rank_threads = std::max(1.0, double(node.threads) / std::max(1, node.ranks));
  const std::vector<std::vector<pp::Action>> lists = pp::schedule_actions(spec);
  std::vector<double> gap(size_t(stages), 0.0);  // per stage, a pass's
  if (size_t(stages) == scan.gap_seconds.size())
    for (size_t st = 0; st < gap.size(); ++st)
      if (scan.gap_passes[st] > 0) gap[st] = scan.gap_seconds[st] / double(scan.gap_passes[st]);
  const std::vector<double> no_gaps;
  auto replay = [&](const std::vector<double>(&seconds)[3], double over, bool gaps) {
    pp::SimCosts costs;
    for (size_t at = 0; at < size_t(stages) * size_t(spec.virtual_stages); ++at) {
      const double g = gaps ? gap[at / size_t(spec.virtual_stages)] : 0.0;
      double mean[3];
      for (int k = 0; k < 3; ++k) {
        const double passes = double(scan.passes[k][at]);
        mean[k] = passes ? seconds[k][at] / passes / over : 0.0;
      }
      if (gaps) costs.link_seconds = links_after_gaps(scan.transfer_seconds, gap);
      costs.forward_seconds.push_back(mean[0] + g);
      // a split backward's B and W, each with its gap
      costs.backward_seconds.push_back(mean[1] + mean[2] + (spec.splits_backward() ? 2 : 1) * g);
      if (spec.splits_backward()) costs.weight_seconds.push_back(mean[2] + g);
    }
    return bubble_less_gaps(pp::simulate(spec, costs), lists, gaps ? gap : no_gaps);
  };
  b.compute = replay(scan.pass_cpu, rank_threads, false);
  b.replayed = replay(scan.pass_wall, 1.0, false);
  b.gaps = replay(scan.pass_wall, 1.0, true);
  for (double g : gap) b.gap_ms += g * 1e3 / double(gap.size());
  b.transfer_ms = scan.transfer_seconds * 1e3;
  double timed_sum = 0;
  int timed_steps = 0;
  for (const auto& [step, seconds] : scan.timed) {
    pp::SimCosts costs;
    costs.forward_seconds.assign(size_t(stages), 0.0);
    costs.backward_seconds.assign(size_t(stages), 0.0);
    costs.timed_seconds = seconds;
    if (!whole_step(seconds, lists)) continue;
    const pp::SimResult r = pp::simulate_lists(spec, lists, costs);
    if (r.deadlock) continue;
    timed_sum += r.bubble_fraction();
    ++timed_steps;
  }
  b.timed = timed_steps ? timed_sum / timed_steps : -1.0;
  b.sampled = sampled_replay(scan, spec, lists, gap);
  return b;
}

void log_timeline(const std::string& path, const Bubbles& b, const pp::ScheduleSpec& spec,
                  const std::string& schedule_name, const NodeShare& node) {
  const std::string schedule = fmt::format(
      "{} p={} m={} v={}{}", schedule_name, spec.stages, spec.micro_batches, spec.virtual_stages,
      spec.kind == pp::ScheduleKind::KFKB ? fmt::format(" k={}", spec.group) : "");
  if (node.threads <= node.cores)
    spdlog::info(
        "pipeline trace: {} ({} steps) | bubble measured {:.3f} (wall time; {:.3f} by CPU "
        "time), replayed {:.3f} with each pass as timed, {:.3f} at the passes' mean wall time "
        "({:.3f} with the executor's {:.3f} ms between spans a pass and {:.3f} ms a transfer, "
        "{:.3f} with each pass drawn from its measured spread too; {:.3f} at their mean CPU "
        "time), ideal {:.3f} ({})",
        path, b.steps, b.wall, b.cpu, b.timed, b.replayed, b.gaps, b.gap_ms, b.transfer_ms,
        b.sampled, b.compute, pp::ideal_bubble_fraction(spec), schedule);
  else  // the clock measures the waits for a core as much as the schedule
    spdlog::info(
        "pipeline trace: {} ({} steps) | bubble {:.3f} from the stages' own compute time (the "
        "schedule replayed with each chunk's mean CPU time a pass), ideal {:.3f} ({}) | not "
        "measured by the clock: {} ranks ({} compute threads) share {} core{} on this machine, "
        "so wall and CPU time count waits for a core, not only for other stages",
        path, b.steps, b.compute, pp::ideal_bubble_fraction(spec), schedule, node.ranks,
        node.threads, node.cores, node.cores == 1 ? "" : "s");
}

}  // namespace

timeline::Measurement timeline::measure(const Rows& rows, const parallel::MeshConfig& mesh,
                                        const pp::ScheduleSpec& spec, int64_t lists_since,
                                        const NodeShare& node) {
  const int n = int(rows.counts.size());
  Scan scan = scan_rows(rows, mesh, spec.placement(), lists_since, n);
  Measurement m;
  m.bubbles = measure_bubbles(scan, node, n, spec, mesh.pp);
  m.events = std::move(scan.events);
  return m;
}

double Trainer::write_timeline(const std::string& path) {
  if (!pipeline_) return -1.0;
  std::vector<int64_t> rows;
  for (const auto& [step, start] : step_starts_)
    rows.insert(rows.end(), {-1, 0, 0, step, start, start, 0});
  for (const pp::Span& s : pipeline_->spans())
    rows.insert(rows.end(),
                {int64_t(s.kind), s.micro, s.chunk, s.step, s.start_ns, s.end_ns, s.cpu_ns});
  parallel::Communicator& world = mesh_->world();
  const Rows gathered = gather_rows(world, std::move(rows), world_rank_ == 0);
  // Spans are wall time: when the ranks' threads outnumber the cores, a rank that waits for
  // a core looks idle, and the measured bubble counts that wait too.
  const NodeShare node = node_share();
  // The activation memory the ranks hold now (their slots made and a split backward's kept
  // gradients): the peak of the steps traced, most on any rank.
  double activations = double(model_->activation_bytes());
  world.all_reduce(view_of(&activations, Shape{1}, DType::F64), parallel::ReduceOp::Max);
  if (world_rank_ != 0) return 0.0;
  const pp::ScheduleSpec& spec = pipeline_->schedule();
  timeline::Measurement measured =
      timeline::measure(gathered, mesh_->config(), spec, lists_since_, node);
  const Bubbles& bubbles = measured.bubbles;
  nlohmann::json doc = {{"traceEvents", std::move(measured.events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"schedule", cfg_.parallel.pp_schedule},
                          {"stages", spec.stages},
                          {"micro_batches", spec.micro_batches},
                          {"virtual_stages", spec.virtual_stages},
                          {"group", spec.group},
                          {"measured_bubble_fraction", bubbles.wall},
                          {"ideal_bubble_fraction", pp::ideal_bubble_fraction(spec)},
                          {"cpu_time_bubble_fraction", bubbles.cpu},
                          {"compute_time_bubble_fraction", bubbles.compute},
                          {"replayed_bubble_fraction", bubbles.replayed},
                          {"gap_replay_bubble_fraction", bubbles.gaps},
                          {"executor_gap_ms", bubbles.gap_ms},
                          {"transfer_ms", bubbles.transfer_ms},
                          {"sampled_replay_bubble_fraction", bubbles.sampled},
                          {"timed_replay_bubble_fraction", bubbles.timed},
                          {"max_activation_bytes", activations},
                          {"threads_on_node", node.threads},
                          {"cores_on_node", node.cores}}}};
  std::ofstream out(path);
  if (!out) fail("cannot write the pipeline trace {}", path);
  out << doc.dump();
  log_timeline(path, bubbles, spec, cfg_.parallel.pp_schedule, node);
  return bubbles.wall;
}

}  // namespace pentad
