// `pentad probe`'s summary (cli/probe.h): islands, links inside and between them, the
// links between hosts measured alone, and the collectives at the largest size measured.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/probe.h"

namespace pentad::probe {
namespace {

using parallel::CollectiveOp;

constexpr CollectiveOp kReportOps[] = {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                                       CollectiveOp::ReduceScatter, CollectiveOp::AllToAll};

// "0-3", "0,2,4,6", "0-1,4-5".
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string min_median_max(std::vector<double> v, double scale, const char* format) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  const auto f = [&](double x) { return fmt::format(fmt::runtime(format), x * scale); };
  return fmt::format(
      "{} / {} / {}", f(v.front()),
      f(v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2])),
      f(v.back()));
}

}  // namespace

std::string describe(const parallel::Topology& t) {
  std::vector<int> island_of(size_t(t.ranks), 0);
  std::vector<std::string> names;
  for (size_t k = 0; k < t.islands.size(); ++k) {
    for (int r : t.islands[k]) island_of[size_t(r)] = int(k);
    names.push_back(fmt::format("[{}]", rank_ranges(t.islands[k])));
  }
  std::vector<std::string> hosts = t.hosts;
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  std::string out = fmt::format("probe: {} ranks on {} host{}, {} island{}: {}\n", t.ranks,
                                hosts.size(), hosts.size() == 1 ? "" : "s", t.islands.size(),
                                t.islands.size() == 1 ? "" : "s", fmt::join(names, " "));
  std::vector<double> latency[2], bandwidth[2];  // [inside, between]
  for (int i = 0; i < t.ranks; ++i)
    for (int j = 0; j < t.ranks; ++j) {
      if (i == j) continue;
      const int between = island_of[size_t(i)] != island_of[size_t(j)];
      latency[between].push_back(t.latency_s[size_t(i)][size_t(j)]);
      bandwidth[between].push_back(t.bandwidth_Bps[size_t(i)][size_t(j)]);
    }
  out += fmt::format("  {:<16} {:>28}  {:>28}\n", "links", "latency us (min / med / max)",
                     "GB/s (min / med / max)");
  const char* rows[2] = {"inside islands", "between islands"};
  for (int k = 0; k < 2; ++k)
    out +=
        fmt::format("  {:<16} {:>28}  {:>28}\n", rows[k], min_median_max(latency[k], 1e6, "{:.1f}"),
                    min_median_max(bandwidth[k], 1e-9, "{:.3g}"));
  for (const parallel::HostLink& l : t.host_links)
    out +=
        fmt::format("  host link {} - {} alone (ranks {}, {}): {:.1f} us, {:.3g} GB/s\n", l.host_a,
                    l.host_b, l.rank_a, l.rank_b, l.latency_s * 1e6, l.bandwidth_Bps * 1e-9);
  // Collectives at the largest size measured: bus GB/s and milliseconds per shape.
  double largest = 0;
  for (const auto& c : t.collectives) largest = std::max(largest, c.bytes);
  if (largest > 0) {
    out += fmt::format("  collectives at about {:.3g} MiB a rank: bus GB/s (ms)\n",
                       largest / (1 << 20));
    out += fmt::format("  {:<16}", "size x stride");
    for (CollectiveOp op : kReportOps) out += fmt::format(" {:>18}", parallel::collective_name(op));
    out += '\n';
    for (const auto& [size, stride] : group_shapes(t.ranks)) {
      std::string line = fmt::format("  {:<16}", fmt::format("{} x {}", size, stride));
      for (CollectiveOp op : kReportOps) {
        const parallel::CollectiveSample* best = nullptr;
        for (const auto& c : t.collectives)
          if (c.op == op && c.size == size && c.stride == stride &&
              (!best || c.bytes > best->bytes))
            best = &c;
        line += best ? fmt::format(" {:>18}", fmt::format("{:.3g} ({:.3g})", best->bus_gbs,
                                                          best->seconds * 1e3))
                     : fmt::format(" {:>18}", "-");
      }
      out += line;
      out += '\n';
    }
  }
  return out;
}

}  // namespace pentad::probe
