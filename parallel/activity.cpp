#include "parallel/activity.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>

namespace pentad::parallel {
namespace {

// The wait: the channel is published last (release) and cleared first, so a reader that
// sees a channel sees the seq, kind and entry time of that wait or of a later one.
struct Activity {
  std::atomic<CommTraceChannel*> channel{nullptr};
  std::atomic<uint64_t> seq{0};
  std::atomic<int> kind{0};
  std::atomic<int64_t> enter_ns{0};
  std::atomic<int64_t> step_wait_ns{0};  // blocked so far in the current step
  // The training thread's own: CPU time at the wait's start and spent waiting this step,
  // and at the last step's end.
  double wait_cpu_start = 0, step_wait_cpu = 0, step_cpu_start = -1;
  std::atomic<bool> started{false};
  std::atomic<int64_t> start_step{0}, step{0}, ckpt_step{-1};
  std::atomic<int64_t> ckpt_wait_ns{0};  // when the checkpoint wait began (0: none)
  int ckpt_wait_depth = 0;               // the training thread's own
  std::atomic<double> step_seconds{0}, wait_seconds{0};
  std::mutex recent_mutex;  // once a step on the training thread, once a beat on the monitor's
  std::deque<ProgressSnapshot::Step> recent;
  // Per peer and direction (0: sends to it, 1: receives from it): the last kLinkSamples
  // seconds per MB.
  std::mutex links_mutex;  // at each transfer on the training thread, once a beat on the monitor's
  std::map<int, std::deque<double>[2]> links;
};
constexpr size_t kRecentSteps = 16;

Activity& activity() {
  static Activity* a = new Activity();  // never destroyed: the monitor may outlive main
  return *a;
}

}  // namespace

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void activity_link_sample(int world_peer, bool sent, int64_t bytes, double seconds) {
  if (world_peer < 0) return;
  // A zero-byte message still costs its latency: counted as one byte, not divided by zero.
  const double mb = double(std::max<int64_t>(bytes, 1)) / double(1 << 20);
  Activity& a = activity();
  std::lock_guard lock(a.links_mutex);
  std::deque<double>& samples = a.links[world_peer][sent ? 0 : 1];
  samples.push_back(seconds / mb);
  if (samples.size() > kLinkSamples) samples.pop_front();
}

void activity_wait_begin(const TraceTicket& ticket) {
  if (!ticket.channel) return;
  Activity& a = activity();
  a.wait_cpu_start = thread_cpu_seconds();
  a.seq.store(ticket.seq, std::memory_order_relaxed);
  a.kind.store(int(ticket.kind), std::memory_order_relaxed);
  a.enter_ns.store(trace_now_ns(), std::memory_order_relaxed);
  a.channel.store(ticket.channel, std::memory_order_release);
}

void activity_wait_end() {
  Activity& a = activity();
  if (a.channel.exchange(nullptr, std::memory_order_acq_rel) == nullptr) return;
  a.step_wait_cpu += thread_cpu_seconds() - a.wait_cpu_start;
  a.step_wait_ns.fetch_add(trace_now_ns() - a.enter_ns.load(std::memory_order_relaxed),
                           std::memory_order_relaxed);
}

void activity_run_started(int64_t start_step) {
  Activity& a = activity();
  a.start_step.store(start_step);
  a.step.store(start_step);
  a.step_wait_ns.store(0);
  a.step_wait_cpu = 0;
  a.step_cpu_start = thread_cpu_seconds();
  a.started.store(true, std::memory_order_release);
}

void activity_step_done(int64_t steps_done, double step_seconds) {
  Activity& a = activity();
  const double wait_seconds = 1e-9 * double(a.step_wait_ns.exchange(0));
  const double cpu = thread_cpu_seconds();
  const double compute_cpu =
      a.step_cpu_start < 0 ? 0.0 : std::max(0.0, cpu - a.step_cpu_start - a.step_wait_cpu);
  a.step_cpu_start = cpu;
  a.step_wait_cpu = 0;
  a.wait_seconds.store(wait_seconds);
  a.step_seconds.store(step_seconds);
  {
    std::lock_guard lock(a.recent_mutex);
    a.recent.push_back({steps_done, step_seconds, wait_seconds, compute_cpu});
    if (a.recent.size() > kRecentSteps) a.recent.pop_front();
  }
  a.step.store(steps_done, std::memory_order_release);
}

void activity_checkpoint_committed(int64_t step) {
  activity().ckpt_step.store(step);
}

void activity_checkpoint_wait_begin() {
  Activity& a = activity();
  if (a.ckpt_wait_depth++ == 0) a.ckpt_wait_ns.store(trace_now_ns(), std::memory_order_release);
}

void activity_checkpoint_wait_end() {
  Activity& a = activity();
  if (a.ckpt_wait_depth > 0 && --a.ckpt_wait_depth == 0)
    a.ckpt_wait_ns.store(0, std::memory_order_release);
}

WaitSnapshot activity_wait() {
  Activity& a = activity();
  WaitSnapshot w;
  if (const int64_t since = a.ckpt_wait_ns.load(std::memory_order_acquire); since > 0)
    w.checkpoint_s = 1e-9 * double(trace_now_ns() - since);
  const CommTraceChannel* channel = a.channel.load(std::memory_order_acquire);
  if (!channel) return w;
  w.waiting = true;
  w.comm = trace_channel_name(channel);
  w.members = trace_channel_members(channel);
  w.seq = a.seq.load(std::memory_order_relaxed);
  w.kind = comm_kind_name(CommKind(a.kind.load(std::memory_order_relaxed)));
  w.since_s = 1e-9 * double(trace_now_ns() - a.enter_ns.load(std::memory_order_relaxed));
  return w;
}

ProgressSnapshot activity_progress() {
  Activity& a = activity();
  ProgressSnapshot p;
  p.started = a.started.load(std::memory_order_acquire);
  p.start_step = a.start_step.load();
  p.step = a.step.load(std::memory_order_acquire);
  p.step_seconds = a.step_seconds.load();
  p.wait_seconds = a.wait_seconds.load();
  p.ckpt_step = a.ckpt_step.load();
  std::lock_guard lock(a.recent_mutex);
  p.recent.assign(a.recent.begin(), a.recent.end());
  return p;
}

std::vector<LinkCost> activity_links() {
  auto median = [](const std::deque<double>& d) {
    if (d.empty()) return -1.0;
    std::vector<double> v(d.begin(), d.end());
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  Activity& a = activity();
  std::vector<LinkCost> links;
  std::lock_guard lock(a.links_mutex);
  for (const auto& [peer, samples] : a.links)
    links.push_back({peer, median(samples[0]), median(samples[1])});
  return links;
}

}  // namespace pentad::parallel
