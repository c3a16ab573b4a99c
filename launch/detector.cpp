#include "launch/detector.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace pentad::launch {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2) return v[mid];
  return 0.5 * (v[mid] + *std::max_element(v.begin(), v.begin() + mid));
}

std::string describe(const Wait& w) {
  return fmt::format("{} #{} on {}", w.kind, w.seq, w.comm);
}

}  // namespace

int Detector::message(const nlohmann::json& msg, double now, std::string* error) {
  // Field access with defaults: a rank of another version may send more or fewer fields,
  // and one odd message must not take the supervisor down.
  if (!msg.is_object() || !msg.contains("rank") || !msg["rank"].is_number_integer()) {
    *error = "a message without an integer \"rank\"";
    return -1;
  }
  const int rank = msg["rank"].get<int>();
  const std::string type = msg.value("type", "");
  RankState& r = ranks_[rank];
  r.last_heard_at = now;
  if (type == "hello") {
    world_ = std::max(world_, msg.value("world", 0));
    r.pid = msg.value("pid", int64_t{0});
    r.host = msg.value("host", "");
    r.out_dir = msg.value("out_dir", "");
    r.resume_step = msg.value("resume_step", int64_t{0});
    r.step = r.resume_step;
    if (msg.contains("ckpt_dirs") && msg["ckpt_dirs"].is_array())
      for (const auto& dir : msg["ckpt_dirs"])
        if (dir.is_string()) r.ckpt_dirs.push_back(dir.get<std::string>());
  } else if (type == "started") {  // the step training starts from, after any resume
    r.resume_step = msg.value("resume_step", int64_t{0});
    r.step = std::max(r.step, r.resume_step);
  } else if (type == "beat") {
    r.phase = msg.value("phase", "other");
    r.ckpt_step = msg.value("ckpt_step", int64_t{-1});
    const int64_t step = msg.value("step", r.step);
    const double step_seconds = msg.value("step_seconds", 0.0);
    // Every step since the last beat comes in "recent" ([step, seconds, wait seconds], oldest
    // first; steps can be shorter than a beat); without it, the beat's last step, once.
    const int64_t recorded = r.history.empty() ? r.step : std::max(r.step, r.history.back().step);
    if (msg.contains("recent") && msg["recent"].is_array()) {
      int64_t last = recorded;
      for (const auto& s : msg["recent"])
        if (s.is_array() && s.size() >= 3 && s[0].is_number_integer() && s[1].is_number() &&
            s[2].is_number() && s[0].get<int64_t>() > last && s[1].get<double>() > 0) {
          last = s[0].get<int64_t>();
          r.history.push_back({last, s[1].get<double>(), s[2].get<double>(), now,
                               s.size() > 3 && s[3].is_number() ? s[3].get<double>() : -1.0});
        }
    } else if (step > r.step && step_seconds > 0) {
      r.history.push_back({step, step_seconds, msg.value("wait_seconds", 0.0), now});
    }
    for (size_t i = 0; i < r.history.size() && r.early.size() < kEarlySteps; ++i)
      if (const StepRecord& h = r.history[i];
          h.step > r.resume_step + 1 && (r.early.empty() || h.step > r.early.back().step))
        r.early.push_back(h);
    while (r.history.size() > kHistorySteps) r.history.pop_front();
    r.step = std::max(r.step, step);
    r.wait.reset();
    if (r.phase == "wait" && msg.contains("wait") && msg["wait"].is_object()) {
      const auto& w = msg["wait"];
      Wait wait;
      wait.comm = w.value("comm", "");
      wait.kind = w.value("kind", "");
      wait.seq = w.value("seq", int64_t{0});
      wait.members = w.value("members", std::vector<int>{});
      // A wait under way when the detector was re-armed counts from then (rearm()).
      wait.entered_at = std::max(now - w.value("since_s", 0.0), waits_from_);
      r.wait = wait;
    }
    if (msg.contains("done") && msg["done"].is_object())
      for (const auto& item : msg["done"].items())
        if (item.value().is_number_integer())
          if (const int64_t seq = item.value().get<int64_t>(); seq > r.done[item.key()].seq)
            r.done[item.key()] = {seq, now};
    // The rank's row of the link matrix: [[peer, send s/MB, receive s/MB], ...] (-1, or a
    // missing third field: not measured).
    if (msg.contains("p2p") && msg["p2p"].is_array())
      for (const auto& row : msg["p2p"])
        if (row.is_array() && row.size() >= 2 && row[0].is_number_integer() && row[1].is_number()) {
          const int peer = row[0].get<int>();
          if (row[1].get<double>() >= 0) r.send_s_per_mb[peer] = row[1].get<double>();
          if (row.size() >= 3 && row[2].is_number() && row[2].get<double>() >= 0)
            r.recv_s_per_mb[peer] = row[2].get<double>();
        }
  } else if (type == "bye") {
    r.bye = msg.value("status", "error");
    r.bye_message = msg.value("message", "");
    if (msg.contains("cause") && msg["cause"].is_object()) {
      r.cause_kind = msg["cause"].value("kind", "");
      r.cause_path = msg["cause"].value("path", "");
    }
  } else {
    *error = fmt::format("rank {}: unknown message type \"{}\"", rank, type);
    return -1;
  }
  return rank;
}

void Detector::vanished(int rank, double now) {
  RankState& r = ranks_[rank];
  if (r.closed) return;
  r.closed = true;
  r.closed_at = now;
}

Detection Detector::launcher_failed(int status, double now) const {
  // The culprit is the rank that reported an error or vanished first, when one did.
  Detection d{"dead", {}, now, now, fmt::format("the launcher exited with status {}", status)};
  double first = std::numeric_limits<double>::max();
  for (const auto& [rank, r] : ranks_) {
    const bool failed = r.bye == "error" || (r.closed && r.bye.empty());
    if (failed && r.last_heard_at < first) {
      first = r.last_heard_at;
      d.culprit = {rank};
      d.first_sign_at = r.last_heard_at;
    }
  }
  return d;
}

double Detector::median_step_seconds() const {
  std::vector<double> per_rank;
  for (const auto& [rank, r] : ranks_) {
    std::vector<double> s;
    for (const StepRecord& h : r.history) s.push_back(h.step_seconds);
    if (!s.empty()) per_rank.push_back(median(s));
  }
  return per_rank.empty() ? options_.prior_step_seconds : median(per_rank);
}

double Detector::hang_threshold_s() const {
  const double step = median_step_seconds();
  // Before any step completes nothing is known of the step time: the floor, widened for
  // start-up (first steps compile, allocate and warm caches).
  if (step <= 0) return 5 * options_.hang_floor_s;
  return std::max(options_.hang_floor_s, options_.hang_factor * step);
}

bool Detector::all_done() const {
  if (ranks_.empty() || int(ranks_.size()) < world_) return false;
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const auto& kv) { return kv.second.bye == "done"; });
}

bool Detector::silent(const RankState& r, double now) const {
  return now - r.last_heard_at > options_.beat_timeout_s;
}

bool Detector::several_hosts() const {
  std::set<std::string> hosts;
  for (const auto& [rank, r] : ranks_)
    if (!r.host.empty()) hosts.insert(r.host);
  return hosts.size() > 1;
}

std::vector<int> Detector::ranks_of(const std::string& host) const {
  std::vector<int> ranks;
  for (const auto& [rank, r] : ranks_)
    if (r.host == host) ranks.push_back(rank);
  return ranks;
}

Detection Detector::on_hosts(Detection d, double now) const {
  if (!several_hosts() || d.culprit.empty()) return d;
  std::set<std::string> hosts;
  for (int rank : d.culprit)
    if (auto it = ranks_.find(rank); it != ranks_.end() && !it->second.host.empty())
      hosts.insert(it->second.host);
  if (hosts.size() == 2 && (d.cls == "comm hang" || d.cls == "comm slow")) {
    d.host = *hosts.begin();
    d.peer_host = *hosts.rbegin();
    d.reason += fmt::format(" (between hosts {} and {})", d.host, d.peer_host);
    return d;
  }
  if (hosts.size() != 1) return d;
  // Every rank of the culprit's host gone or silent, while a rank of another host is heard
  // (or ended with a bye, as mpirun's SIGTERM makes the rest do): the host, not a rank.
  const std::string host = *hosts.begin();
  bool every_gone = true, every_lost = true, others_heard = false;
  for (const auto& [rank, r] : ranks_) {
    const bool gone = r.closed && r.bye.empty();
    if (r.host == host) {
      every_gone = every_gone && gone;
      every_lost = every_lost && (gone || (r.bye.empty() && silent(r, now)));
    } else {
      others_heard = others_heard || (!gone && (!silent(r, now) || !r.bye.empty()));
    }
  }
  if (!every_lost || !others_heard) return d;
  const std::vector<int> ranks = ranks_of(host);
  d.reason = fmt::format(
      "{}'s {} ranks ({}) {} together while other hosts' ranks are heard: {}; {}", host,
      ranks.size(), fmt::join(ranks, ","), every_gone ? "closed their connections" : "fell silent",
      every_gone ? "the host or its processes died" : "its link is down, or the host is stuck",
      d.reason);
  d.cls = every_gone ? "host down" : "host unreachable";
  d.culprit = ranks;
  d.host = host;
  return d;
}

std::optional<Detection> Detector::check(double now) {
  if (!fatal_reported_) {
    for (auto rule : {&Detector::check_dead, &Detector::check_hang, &Detector::check_silent}) {
      if (auto d = (this->*rule)(now)) {
        fatal_reported_ = true;
        return on_hosts(*d, now);
      }
    }
  }
  if (!compute_slow_reported_)
    if (auto d = check_compute_slow(now)) {
      compute_slow_reported_ = true;
      return d;
    }
  if (!link_slow_reported_)
    if (auto d = check_link_slow(now)) {
      link_slow_reported_ = true;
      return d;
    }
  return std::nullopt;
}

// A rank whose connection closed or process vanished without a bye, or that said bye with an
// error: the first of them. Its last beat is the first sign.
std::optional<Detection> Detector::check_dead(double now) const {
  std::optional<Detection> found;
  double first = std::numeric_limits<double>::max();
  // With several hosts, a rank gone while others of its host still run may be the first of
  // a host going down: its host gets kHostWindowSeconds to follow before the rank is named.
  auto host_may_follow = [&](const RankState& dead) {
    if (!several_hosts() || now - dead.closed_at >= kHostWindowSeconds) return false;
    return std::any_of(ranks_.begin(), ranks_.end(), [&](const auto& kv) {
      return kv.second.host == dead.host && !kv.second.closed && kv.second.bye.empty();
    });
  };
  for (const auto& [rank, r] : ranks_) {
    const bool died = r.closed && r.bye.empty();
    if (died && host_may_follow(r)) continue;
    const double at = r.bye == "error" ? r.last_heard_at : r.closed_at;
    if ((died || r.bye == "error") && at < first) {
      first = at;
      const std::string reason =
          died ? "its connection closed without a bye" : "it reported an error: " + r.bye_message;
      found = Detection{"dead", {rank}, r.last_heard_at, now, reason};
    }
  }
  return found;
}

// Whether a wait shown by a beat has since completed on some member (kStaleWaitSeconds).
bool Detector::stale(const Wait& w, double now) const {
  if (w.kind == "send" || w.kind == "recv") return false;  // numbered apart on each rank
  for (int m : w.members)
    if (auto it = ranks_.find(m); it != ranks_.end())
      if (auto d = it->second.done.find(w.comm); d != it->second.done.end() &&
                                                 d->second.seq >= w.seq &&
                                                 now - d->second.since < kStaleWaitSeconds)
        return true;
  return false;
}

// Once some rank has waited past the threshold: the collective most ranks wait in (ties: the
// longest wait), and the member of its communicator that is not in it: that member holds the
// others up. (The culprit may itself be blocked elsewhere, and longer, so neither its wait
// nor only the waits already past the threshold are the ones to judge by.)
std::optional<Detection> Detector::check_hang(double now) const {
  const double threshold = hang_threshold_s();
  std::map<std::tuple<std::string, int64_t, std::vector<int>>, std::vector<int>> waiting;
  bool overdue = false;
  for (const auto& [rank, r] : ranks_) {
    if (r.closed || !r.bye.empty() || !r.wait || silent(r, now)) continue;
    // A wait in a collective that a member has since completed: the beat that shows it is
    // older than that completion, and where the rank is now, and so who holds whom up, is
    // not known yet (a 5.6 s checkpoint write ended, rank 0 computed again, and the others'
    // beats from before the collective completed named it). The next beats tell.
    if (stale(*r.wait, now)) return std::nullopt;
    overdue = overdue || now - r.wait->entered_at > threshold;
    waiting[{r.wait->comm, r.wait->seq, r.wait->members}].push_back(rank);
  }
  if (!overdue) return std::nullopt;
  const RankState* waiter = nullptr;
  int waiter_rank = -1;
  size_t most = 0;
  for (const auto& [collective, ranks] : waiting)
    for (int rank : ranks) {
      const RankState& r = ranks_.at(rank);
      if (ranks.size() > most ||
          (ranks.size() == most && r.wait->entered_at < waiter->wait->entered_at)) {
        most = ranks.size();
        waiter = &r;
        waiter_rank = rank;
      }
    }
  if (!waiter) return std::nullopt;
  const Wait& w = *waiter->wait;
  // A member blocked on its checkpoint's disk work (phase "checkpoint", outside collectives)
  // holds the others up for as long as the disk takes: a loaded disk once took 2 s, the hang
  // floor. It is named only past kCheckpointHangFactor x the threshold (a full or hung disk).
  const double disk_threshold = std::max(kCheckpointHangSeconds, kCheckpointHangFactor * threshold);
  for (int m : w.members) {
    auto it = ranks_.find(m);
    if (it != ranks_.end() && !it->second.closed && !it->second.wait &&
        it->second.phase == "checkpoint" && !silent(it->second, now) &&
        now - w.entered_at <= disk_threshold)
      return std::nullopt;
  }
  const std::string waited = fmt::format("rank {} waited {:.1f} s in {} (threshold {:.1f} s)",
                                         waiter_rank, now - w.entered_at, describe(w), threshold);
  for (int m : w.members) {  // lowest first when several qualify
    auto it = ranks_.find(m);
    if (it == ranks_.end())
      return Detection{"non-comm hang", {m}, w.entered_at, now, waited + "; it never said hello"};
    const RankState& r = it->second;
    if (r.closed)
      return Detection{"dead", {m}, w.entered_at, now, waited + "; its connection closed"};
    const bool same = r.wait && r.wait->comm == w.comm && r.wait->seq == w.seq;
    if (same && !silent(r, now)) continue;
    // A silent rank (stopped, or its host stuck) is not responding, whatever it last said: its
    // last beat may show a wait it has long left.
    const bool other_collective = r.wait && !same && !silent(r, now);
    std::string state =
        r.wait && !same ? "it waits in " + describe(*r.wait) : "its last phase was " + r.phase;
    if (silent(r, now))
      state = fmt::format("silent {:.1f} s, last ", now - r.last_heard_at) + state;
    return Detection{other_collective ? "comm hang" : "non-comm hang",
                     {m},
                     w.entered_at,
                     now,
                     waited + "; " + state};
  }
  // Every member waits in the same collective: the fault is between them (a link, a switch).
  return Detection{"comm hang", w.members, w.entered_at, now,
                   waited + "; every member waits in it (a link?)"};
}

// A rank silent (SIGSTOP, a stuck host) while no one waits on it yet.
std::optional<Detection> Detector::check_silent(double now) const {
  const double limit = std::max(options_.beat_timeout_s, hang_threshold_s());
  for (const auto& [rank, r] : ranks_) {
    if (r.closed || !r.bye.empty() || now - r.last_heard_at <= limit) continue;
    return Detection{"non-comm hang",
                     {rank},
                     r.last_heard_at,
                     now,
                     fmt::format("unresponsive: no beat for {:.1f} s, last phase {}",
                                 now - r.last_heard_at, r.phase)};
  }
  return std::nullopt;
}

// One rank computes >= 1.5x longer than the median of the others on each of the last
// kSlowSteps steps they all reported, and the others spend that difference waiting: at least
// half of it, summed over those steps (a wait can fall on either side of a step boundary: a
// checkpoint save moves it, so one step's wait can be short and the next one's long). And
// so for kSlowSeconds: on every check since the first slow step of its first such window.
std::optional<Detection> Detector::check_compute_slow(double now) {
  const int was_slow = slow_rank_;
  slow_rank_ = -1;  // unless this check finds the same rank slow again
  if (ranks_.size() < 2) return std::nullopt;
  std::map<int64_t, std::map<int, const StepRecord*>> by_step;  // step -> rank -> record
  for (const auto& [rank, r] : ranks_)
    for (const StepRecord& h : r.history) by_step[h.step][rank] = &h;
  std::vector<int64_t> steps;  // newest first, reported by every rank
  for (auto it = by_step.rbegin(); it != by_step.rend() && steps.size() < kSlowSteps; ++it)
    if (it->second.size() == ranks_.size()) steps.push_back(it->first);
  if (steps.size() < kSlowSteps) return std::nullopt;

  for (const auto& [culprit, state] : ranks_) {
    bool slow_every_step = true;
    double ratio_sum = 0, excess_sum = 0, wait_sum = 0, seconds = 0;
    for (int64_t step : steps) {
      const auto& records = by_step[step];
      const StepRecord& mine = *records.at(culprit);
      std::vector<double> compute, waits;
      // Compute time: the rank's CPU time outside waits where it reports it (a descheduled
      // rank is not slow at its work), else the clock's.
      auto compute_of = [](const StepRecord& h) {
        return h.compute_cpu >= 0 ? h.compute_cpu : h.step_seconds - h.wait_seconds;
      };
      for (const auto& [rank, h] : records)
        if (rank != culprit) {
          compute.push_back(compute_of(*h));
          waits.push_back(h->wait_seconds);
        }
      const double my_compute = compute_of(mine);
      const double others = median(compute);
      const double excess = my_compute - others;
      // The excess must also matter: a tenth of the step at least.
      if (my_compute < 1.5 * others || excess < std::max(1e-3, 0.1 * mine.step_seconds)) {
        slow_every_step = false;
        break;
      }
      ratio_sum += others > 0 ? my_compute / others : 0;
      seconds += mine.step_seconds;
      excess_sum += excess;
      wait_sum += median(waits);
    }
    if (!slow_every_step || wait_sum < 0.5 * excess_sum) continue;
    const StepRecord& first = *by_step[steps.back()].at(culprit);
    // Slow for kSlowSeconds: over this window's steps, or since an earlier check's window
    // where every check since found it slow too.
    slow_since_ = was_slow == culprit ? std::min(slow_since_, first.seen_at) : first.seen_at;
    slow_rank_ = culprit;
    if (std::max(seconds, now - slow_since_) < kSlowSeconds) return std::nullopt;
    return Detection{"non-comm slow",
                     {culprit},
                     slow_since_,
                     now,
                     fmt::format("computes {:.1f}x the others' time over steps {}..{} while "
                                 "they wait for it",
                                 ratio_sum / double(steps.size()), steps.back(), steps.front())};
  }
  return std::nullopt;
}

// The per-peer link matrix, when the ranks measure it (beats carrying "p2p"). The link from
// j to i costs the lesser of j's send time to i and i's receive time from j: a late receiver
// lengthens the send only, a late sender the receive only, a slow link both (on a ring held
// up by one slow link, the sends into the rank that waits on it are slow too, and the
// receives after it). A pair costs its worse direction. A pair whose cost is >= kLinkFactor
// x the median pair's, running for kLinkSteps median steps (the ranks' values are already
// medians of their last transfers; this is for the pair to stay slow, not one stall of a
// descheduled rank), is a slow link. Needs three pairs at least, or no median is "typical"
// (between hosts, the pair's own first samples serve too: below). Without "p2p" (MPI's own
// collectives), links are not judged.
std::optional<Detection> Detector::check_link_slow(double now) {
  std::set<int> silent;  // stopped or gone quiet: their stalled pairs are the hang rules' case
  for (const auto& [rank, r] : ranks_)
    if (now - r.last_heard_at > kLinkSilentSeconds) silent.insert(rank);
  std::map<std::pair<int, int>, double> pairs;  // (low, high) -> worse direction, s per MB
  for (const auto& [from, r] : ranks_) {
    if (r.closed || !r.bye.empty() || silent.count(from)) continue;
    const int self = from;  // clang 14 does not capture structured bindings
    auto add = [&pairs, &silent, self](int to, double s) {
      if (silent.count(to)) return;
      auto key = std::minmax(self, to);
      pairs[key] = std::max(pairs[key], s);
    };
    for (const auto& [to, sent] : r.send_s_per_mb) {
      auto it = ranks_.find(to);
      double cost = sent;
      if (it != ranks_.end())
        if (auto got = it->second.recv_s_per_mb.find(from); got != it->second.recv_s_per_mb.end())
          cost = std::min(cost, got->second);
      add(to, cost);
    }
    for (const auto& [source, got] : r.recv_s_per_mb) {  // a link whose sender says nothing
      auto it = ranks_.find(source);
      if (it == ranks_.end() || !it->second.send_s_per_mb.count(from)) add(source, got);
    }
  }
  // A collective held up for longer than any step takes (twice the median step, at least
  // kLinkStallSeconds) is a hang in the making: the transfers it stalls, even between ranks
  // that wait for a third, read as slow pairs, and the hang rules are the ones to judge it
  // (fault_detection's commhang case was once named "comm slow" under a loaded machine).
  const double stalled = std::max(kLinkStallSeconds, 2 * median_step_seconds());
  for (const auto& [rank, r] : ranks_)
    if (!r.closed && r.bye.empty() && r.wait && !silent.count(rank) &&
        now - r.wait->entered_at > stalled) {
      link_slow_since_.clear();
      return std::nullopt;
    }
  for (auto it = link_slow_since_.begin(); it != link_slow_since_.end();)
    it = silent.count(it->first.first) || silent.count(it->first.second)
             ? link_slow_since_.erase(it)
             : std::next(it);
  // Pairs are compared with their like: inside a host with the median pair inside hosts,
  // between two hosts with the median pair between those two (three pairs at least for a
  // median to be typical) and with the pair's own first samples (a throttled host link
  // slows all its pairs at once). On one host that is today's rule: the median of all pairs.
  auto host_of = [&](int rank) {
    auto it = ranks_.find(rank);
    return it == ranks_.end() ? std::string() : it->second.host;
  };
  using HostPair = std::pair<std::string, std::string>;  // ("", ""): inside one host
  auto class_of = [&](const std::pair<int, int>& key) {
    const std::string a = host_of(key.first), b = host_of(key.second);
    if (a == b || a.empty() || b.empty()) return HostPair{};
    return a < b ? HostPair{a, b} : HostPair{b, a};
  };
  std::map<HostPair, std::vector<double>> by_class;
  for (const auto& [key, s] : pairs) by_class[class_of(key)].push_back(s);
  std::map<HostPair, double> typical;
  for (const auto& [cls, costs] : by_class)
    if (costs.size() >= 3) typical[cls] = median(costs);
  const double hold_s = std::max(options_.link_slow_s, kLinkSteps * median_step_seconds());
  std::optional<Detection> found;
  for (const auto& [key, s] : pairs) {
    const auto cls = class_of(key);
    const bool between_hosts = !cls.first.empty();
    double measure = 0;  // what the pair is slow against (0: nothing yet)
    std::string against;
    if (auto t = typical.find(cls); t != typical.end() && t->second > 0) {
      measure = t->second;
      against = between_hosts ? "the median pair between its hosts'" : "the median pair's";
    }
    if (between_hosts) {
      std::vector<double>& first = link_first_[key];
      if (first.size() < kLinkBaselineSamples) first.push_back(s);
      const double baseline = first.size() == kLinkBaselineSamples ? median(first) : 0;
      if (baseline > 0 && (measure <= 0 || baseline < measure)) {
        measure = baseline;
        against = fmt::format("its own first {} samples'", kLinkBaselineSamples);
      }
    }
    if (measure <= 0 || s < kLinkFactor * measure) {
      link_slow_since_.erase(key);
      continue;
    }
    const double since = link_slow_since_.try_emplace(key, now).first->second;
    if (!found && now - since >= hold_s) {
      found = Detection{
          "comm slow",
          {key.first, key.second},
          since,
          now,
          fmt::format("link {}-{} takes {:.3g} s/MB, {:.1f}x {} {:.3g} s/MB, for "
                      "{:.1f} s",
                      key.first, key.second, s, s / measure, against, measure, now - since)};
      found->factor = s / measure;
    }
  }
  if (found) return on_hosts(*found, now);
  return found;
}

}  // namespace pentad::launch
