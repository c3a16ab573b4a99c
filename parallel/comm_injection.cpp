// Simulated slowness (comm.h, Injection): a slow rank sleeps before each collective, and a
// slow outgoing link delivers each send late without blocking the sender. A late send is
// queued with the time its link frees up and posted by post_due_sends() once that time has
// come; every Work of a communicator with an injection or queued sends pumps the queue when
// tested or waited, so two ranks waiting on each other's late sends both progress. With no
// injection set, nothing here changes what is posted.
#include <algorithm>
#include <chrono>
#include <thread>

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
  if (injected_seconds(1) <= 0) {
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
    if (!ops[i].is_send || injected_seconds(int64_t(ops[i].buf.bytes()), ops[i].peer) <= 0) {
      now_ops.push_back(ops[i]);
      now_index.push_back(i);
      continue;
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(injected_seconds(int64_t(ops[i].buf.bytes()), ops[i].peer)));
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

}  // namespace pentad::parallel
