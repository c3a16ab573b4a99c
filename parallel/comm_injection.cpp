// Simulated slowness (comm.h, Injection): a slow rank sleeps before each collective, and a
// slow outgoing link delivers each send late without blocking the sender. A late send is
// queued with the time its link frees up and posted by post_due_sends() once that time has
// come; every Work of a communicator with an injection or queued sends pumps the queue when
// tested or waited, so two ranks waiting on each other's late sends both progress. With no
// injection set, nothing here changes what is posted.
//
// Simulated nodes (comm.h, SimulatedNodes) reuse the late sends for transfers between nodes.
// A collective cannot be slowed link by link from outside the backend, so it is slowed as a
// whole, by the time its traffic between nodes would take on a ring through the group in
// group order (the ring that bandwidth-optimal collectives use): each step every rank sends
// one chunk to the next, and a step lasts as long as its slowest edge, so when any edge of
// the ring crosses nodes each step costs the extra latency plus chunk / bandwidth:
//   all_reduce (and broadcast, as scatter + all-gather): 2 (p - 1) steps of bytes / p;
//   all_gather, reduce_scatter, all_to_all: p - 1 steps of bytes / p;
//   barrier: p - 1 steps of nothing;
// with bytes as in parallel/topology.h (all_gather: the output; reduce_scatter, all_to_all:
// the input). That time is wire time, as a network's: the collective is posted at once and
// does not complete on any rank of the group before it has passed, so an asynchronous one
// (ZeRO's gradient buckets during backward) runs behind the caller's computation as it would
// between real nodes, and a blocking one lasts that much longer. A communicator's
// collectives cross one at a time: each starts when the one before it on that communicator
// has passed (other communicators' traffic is not counted against it). A barrier sleeps.
// Pentad's own ring all-reduce runs over sends, which are slowed one by one instead.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {

void Communicator::set_injection(const Injection& injection) {
  PENTAD_CHECK(injection.link_peer == -1 || (injection.links_only && injection.slow_rank >= 0 &&
                                             injection.link_peer != injection.slow_rank),
               "communicator '{}': a slow link needs links_only and two distinct ends ({}, {})",
               name_, injection.slow_rank, injection.link_peer);
  injection_ = injection;
}

double Communicator::injected_seconds(int64_t bytes, int peer) const {
  const int a = injection_.slow_rank, b = injection_.link_peer;
  if (b == -1) {
    if (a != -1 && a != rank_) return 0.0;
  } else if (!(rank_ == a && (peer == -1 || peer == b)) &&
             !(rank_ == b && (peer == -1 || peer == a))) {
    return 0.0;  // not an end of the slow link, or a send to someone else
  }
  double seconds = injection_.delay_seconds;
  if (injection_.bytes_per_second > 0) seconds += double(bytes) / injection_.bytes_per_second;
  return seconds;
}

void Communicator::inject(int64_t bytes) const {
  if (injection_.links_only) return;
  const double seconds = injected_seconds(bytes);
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// A send on a slow link: the real operation is posted by post_due_sends once its time has come.
class DeferredSend final : public WorkImpl {
 public:
  explicit DeferredSend(Communicator& comm) : comm_(comm) {}
  ~DeferredSend() override {
    if (!posted_) comm_.post_due_sends(true);  // never leave a queued pointer behind
  }
  bool test() override {
    comm_.post_due_sends(false);
    return posted_ && posted_->test();
  }
  void wait() override {
    while (!posted_) {
      comm_.post_due_sends(false);
      if (!posted_) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    posted_->wait();
  }
  bool keep_ticket(const TraceTicket& ticket) override { return posted_->keep_ticket(ticket); }
  std::unique_ptr<WorkImpl>* slot() { return &posted_; }

 private:
  Communicator& comm_;
  std::unique_ptr<WorkImpl> posted_;
};

// Any operation on a communicator with deferred sends: testing or waiting also posts the
// sends that have come due.
class PumpingWork final : public WorkImpl {
 public:
  PumpingWork(Communicator& comm, std::unique_ptr<WorkImpl> inner)
      : comm_(comm), inner_(std::move(inner)) {}
  bool test() override {
    comm_.post_due_sends(false);
    return inner_->test();
  }
  void wait() override {
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  Communicator& comm_;
  std::unique_ptr<WorkImpl> inner_;
};

void Communicator::post_due_sends(bool wait_for_all) {
  while (!deferred_.empty()) {
    Deferred& d = deferred_.front();
    if (!wait_for_all && std::chrono::steady_clock::now() < d.due) return;
    if (wait_for_all) std::this_thread::sleep_until(d.due);
    std::vector<std::unique_ptr<WorkImpl>> impls = post_p2p_routed({d.op});
    *d.posted = std::move(impls.at(0));
    deferred_.pop_front();
  }
}

std::unique_ptr<WorkImpl> Communicator::pump_if_delayed(std::unique_ptr<WorkImpl> impl) {
  if (injected_seconds(1) > 0 || !deferred_.empty())
    impl = std::make_unique<PumpingWork>(*this, std::move(impl));
  return impl;
}

std::vector<std::unique_ptr<WorkImpl>> Communicator::post_p2p_delayed(
    const std::vector<P2POp>& ops) {
  std::vector<std::unique_ptr<WorkImpl>> impls;
  if (!may_defer_sends()) {
    impls = post_p2p_routed(ops);
    for (auto& impl : impls) impl = pump_if_delayed(std::move(impl));
    return impls;
  }
  // Sends on a slow link are delivered late (queued, in order per peer); the rest go now.
  link_free_.resize(size_t(size_), std::chrono::steady_clock::time_point{});
  std::vector<P2POp> now_ops;
  std::vector<size_t> now_index;
  impls.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    // Receives, and on a slow link the sends to other peers (never queued, so never behind
    // a late one in the queue), go now.
    const int64_t bytes = int64_t(ops[i].buf.bytes());
    const double late_s =
        injected_seconds(bytes, ops[i].peer) + simulated_link_seconds(bytes, ops[i].peer);
    if (!ops[i].is_send || late_s <= 0) {
      now_ops.push_back(ops[i]);
      now_index.push_back(i);
      continue;
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(late_s));
    auto& free = link_free_[size_t(ops[i].peer)];
    free = std::max(free, std::chrono::steady_clock::now()) + seconds;
    auto deferred = std::make_unique<DeferredSend>(*this);
    deferred_.push_back(Deferred{ops[i], free, deferred->slot()});
    impls[i] = std::move(deferred);
  }
  std::vector<std::unique_ptr<WorkImpl>> posted = post_p2p_routed(now_ops);
  for (size_t j = 0; j < posted.size(); ++j)
    impls[now_index[j]] = std::make_unique<PumpingWork>(*this, std::move(posted[j]));
  return impls;
}

// ---- simulated nodes ----

SimulatedNodes parse_simulated_nodes(const std::string& text) {
  SimulatedNodes nodes;
  if (text.empty()) return nodes;
  const auto refuse = [&](const char* why) {
    fail(
        "PENTAD_SIM_NODES=\"{}\": {}; expected R:LAT_US:GBS (ranks per simulated node, extra "
        "microseconds and GB/s of a transfer between nodes), e.g. 4:200:0.2",
        text, why);
  };
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t colon; (colon = text.find(':', begin)) != std::string::npos; begin = colon + 1)
    parts.push_back(text.substr(begin, colon - begin));
  parts.push_back(text.substr(begin));
  if (parts.size() != 3) refuse("not three fields separated by ':'");
  const auto number = [&](const std::string& part, const char* name) {
    double x = 0;
    const char* end = part.data() + part.size();
    const auto [ptr, ec] = std::from_chars(part.data(), end, x);
    if (part.empty() || ec != std::errc() || ptr != end || !std::isfinite(x))
      refuse(fmt::format("{} '{}' is not a number", name, part).c_str());
    return x;
  };
  const double ranks = number(parts[0], "R");
  nodes.latency_s = number(parts[1], "LAT_US") * 1e-6;
  nodes.bytes_per_second = number(parts[2], "GBS") * 1e9;
  if (ranks < 1 || ranks != std::floor(ranks) || ranks > 1e9)
    refuse("R must be a whole number of ranks, at least 1");
  if (nodes.latency_s < 0) refuse("LAT_US must be at least 0");
  if (!(nodes.bytes_per_second > 0)) refuse("GBS must be above 0");
  nodes.ranks_per_node = int(ranks);
  return nodes;
}

SimulatedNodes simulated_nodes_from_env() {
  const char* text = std::getenv("PENTAD_SIM_NODES");
  return parse_simulated_nodes(text ? text : "");
}

void Communicator::set_simulated_nodes(const SimulatedNodes& nodes) {
  PENTAD_CHECK(deferred_.empty(), "communicator '{}': simulated nodes set with sends pending",
               name_);
  sim_ = nodes;
  sim_node_.clear();
  sim_ring_crossings_ = 0;
  if (!nodes.on()) return;
  const std::vector<int> world = world_ranks();
  PENTAD_CHECK(int(world.size()) == size_, "communicator '{}': {} world ranks for {} ranks", name_,
               world.size(), size_);
  for (int w : world) sim_node_.push_back(w / nodes.ranks_per_node);
  for (int i = 0; i < size_; ++i)
    sim_ring_crossings_ += sim_node_[size_t(i)] != sim_node_[size_t((i + 1) % size_)];
}

double Communicator::simulated_link_seconds(int64_t bytes, int peer) const {
  if (sim_ring_crossings_ == 0 || sim_node_[size_t(rank_)] == sim_node_[size_t(peer)]) return 0.0;
  return sim_.latency_s + double(bytes) / sim_.bytes_per_second;
}

namespace {
// A collective over simulated nodes: done when the real one is and its wire time has passed.
class WireTimeWork final : public WorkImpl {
 public:
  WireTimeWork(std::unique_ptr<WorkImpl> inner, std::chrono::steady_clock::time_point due)
      : inner_(std::move(inner)), due_(due) {}
  bool test() override { return inner_->test() && std::chrono::steady_clock::now() >= due_; }
  void wait() override {
    inner_->wait();
    std::this_thread::sleep_until(due_);
  }

 private:
  std::unique_ptr<WorkImpl> inner_;
  std::chrono::steady_clock::time_point due_;
};
}  // namespace

double Communicator::simulated_collective_seconds(CommKind kind, int64_t bytes) const {
  if (sim_ring_crossings_ == 0) return 0.0;
  const int p = size_;
  const int steps =
      kind == CommKind::AllReduce || kind == CommKind::Broadcast ? 2 * (p - 1) : p - 1;
  const double chunk = double(bytes) / p;
  return steps * (sim_.latency_s + chunk / sim_.bytes_per_second);
}

std::unique_ptr<WorkImpl> Communicator::after_wire_time(std::unique_ptr<WorkImpl> impl,
                                                        double seconds) {
  if (seconds <= 0) return impl;
  const auto now = std::chrono::steady_clock::now();
  sim_link_free_ = std::max(sim_link_free_, now) +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(seconds));
  return std::make_unique<WireTimeWork>(std::move(impl), sim_link_free_);
}

}  // namespace pentad::parallel
