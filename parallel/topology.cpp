// Topology files (parallel/topology.h): reading with a check of every field, writing with one
// matrix row a line, and the predicted time of a collective.
#include "parallel/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/check.h"

namespace pentad::parallel {
namespace {

using nlohmann::json;

constexpr int kVersion = 1;
constexpr CollectiveOp kOps[] = {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                                 CollectiveOp::ReduceScatter, CollectiveOp::AllToAll};

// The field `key` of `object`, or an error naming the file and the field.
const json& field(const json& object, const char* key, const std::string& where,
                  const std::string& path) {
  auto it = object.find(key);
  if (it == object.end()) fail("topology file {}: {} has no field '{}'", path, where, key);
  return *it;
}

double number(const json& value, const std::string& what, const std::string& path) {
  if (!value.is_number())
    fail("topology file {}: {} must be a number, not {}", path, what, value.dump());
  return value.get<double>();
}

int integer(const json& value, const std::string& what, const std::string& path) {
  if (!value.is_number_integer())
    fail("topology file {}: {} must be an integer, not {}", path, what, value.dump());
  return value.get<int>();
}

// An N x N matrix of numbers >= 0 (off the diagonal > 0 where `positive`), times `scale`.
std::vector<std::vector<double>> matrix(const json& value, const char* name, int n, bool positive,
                                        double scale, const std::string& path) {
  const auto shape_error = [&](const std::string& got) {
    fail("topology file {}: {} is {}, but must be {} x {} (one row per rank, \"ranks\": {})", path,
         name, got, n, n, n);
  };
  if (!value.is_array()) shape_error("not an array");
  if (int(value.size()) != n) shape_error(fmt::format("{} rows", value.size()));
  std::vector<std::vector<double>> out(static_cast<size_t>(n),
                                       std::vector<double>(static_cast<size_t>(n)));
  for (int i = 0; i < n; ++i) {
    const json& row = value[size_t(i)];
    if (!row.is_array() || int(row.size()) != n)
      shape_error(fmt::format("row {} of {} entries", i, row.is_array() ? row.size() : 0));
    for (int j = 0; j < n; ++j) {
      const std::string what = fmt::format("{}[{}][{}]", name, i, j);
      const double x = number(row[size_t(j)], what, path);
      if (!std::isfinite(x) || x < 0) fail("topology file {}: {} = {} is negative", path, what, x);
      if (positive && i != j && x <= 0)
        fail("topology file {}: {} = 0, but a link between two ranks needs a bandwidth above 0",
             path, what);
      out[size_t(i)][size_t(j)] = x * scale;
    }
  }
  return out;
}

CollectiveSample sample(const json& value, size_t index, int ranks, const std::string& path) {
  const std::string where = fmt::format("collectives[{}]", index);
  if (!value.is_object()) fail("topology file {}: {} must be an object", path, where);
  CollectiveSample s;
  const json& op = field(value, "op", where, path);
  const std::string name = op.is_string() ? op.get<std::string>() : op.dump();
  auto it = std::find_if(std::begin(kOps), std::end(kOps),
                         [&](CollectiveOp o) { return name == collective_name(o); });
  if (it == std::end(kOps))
    fail(
        "topology file {}: {}.op is '{}', not one of all_reduce, all_gather, reduce_scatter, "
        "all_to_all",
        path, where, name);
  s.op = *it;
  s.size = integer(field(value, "size", where, path), where + ".size", path);
  s.stride = integer(field(value, "stride", where, path), where + ".stride", path);
  if (s.size < 1 || s.stride < 1 || int64_t(s.size) * s.stride > ranks)
    fail(
        "topology file {}: {} has size {} and stride {}, but a group needs size >= 1, "
        "stride >= 1 and size x stride <= ranks ({})",
        path, where, s.size, s.stride, ranks);
  s.bytes = number(field(value, "bytes", where, path), where + ".bytes", path);
  s.seconds = number(field(value, "seconds", where, path), where + ".seconds", path);
  s.bus_gbs = number(field(value, "bus_gbs", where, path), where + ".bus_gbs", path);
  if (!(s.bytes > 0) || !(s.seconds > 0) || !(s.bus_gbs >= 0))
    fail("topology file {}: {} needs bytes > 0, seconds > 0 and bus_gbs >= 0 (has {}, {}, {})",
         path, where, s.bytes, s.seconds, s.bus_gbs);
  return s;
}

// One JSON value a line for arrays of arrays and of objects, the rest compact.
template <typename Json>
std::string rows(const std::vector<Json>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n    " : "\n    ") + items[i].dump();
  return out + (items.empty() ? "]" : "\n  ]");
}

// Six significant digits: more than any measurement holds, and a file a person can read.
double rounded(double x) {
  return std::stod(fmt::format("{:.6g}", x));
}

json matrix_json(const std::vector<std::vector<double>>& m, double scale) {
  json out = json::array();
  for (const auto& row : m) {
    json r = json::array();
    for (double x : row) r.push_back(rounded(x * scale));
    out.push_back(std::move(r));
  }
  return out;
}

// Ring steps and the bytes each moves (topology.h's bytes convention).
std::pair<int, double> ring_steps(CollectiveOp op, int p, double bytes) {
  const int steps = op == CollectiveOp::AllReduce ? 2 * (p - 1) : p - 1;
  return {steps, bytes / p};
}

}  // namespace

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return "all_reduce";
    case CollectiveOp::AllGather:
      return "all_gather";
    case CollectiveOp::ReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::AllToAll:
      return "all_to_all";
  }
  return "?";
}

Topology Topology::read(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("cannot read topology file {}: {} (write one with `mpirun -np N pentad probe -o {}`)",
         path, std::strerror(errno), path);
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    fail("topology file {} is not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object()) fail("topology file {}: the top level must be a JSON object", path);
  const int version = integer(field(doc, "version", "the file", path), "version", path);
  if (version != kVersion)
    fail(
        "topology file {}: version {} is not supported (this pentad reads version {}; "
        "measure again with `pentad probe`)",
        path, version, kVersion);
  Topology t;
  t.ranks = integer(field(doc, "ranks", "the file", path), "ranks", path);
  if (t.ranks < 1) fail("topology file {}: ranks = {}, but must be at least 1", path, t.ranks);
  const json& hosts = field(doc, "hosts", "the file", path);
  if (!hosts.is_array() || int(hosts.size()) != t.ranks)
    fail("topology file {}: hosts must list one host per rank ({}), but has {}", path, t.ranks,
         hosts.is_array() ? fmt::format("{} entries", hosts.size()) : std::string("no array"));
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!hosts[i].is_string())
      fail("topology file {}: hosts[{}] must be a string, not {}", path, i, hosts[i].dump());
    t.hosts.push_back(hosts[i].get<std::string>());
  }
  t.latency_s =
      matrix(field(doc, "latency_us", "the file", path), "latency_us", t.ranks, false, 1e-6, path);
  t.bandwidth_Bps = matrix(field(doc, "bandwidth_gbs", "the file", path), "bandwidth_gbs", t.ranks,
                           true, 1e9, path);
  if (auto it = doc.find("collectives"); it != doc.end()) {
    if (!it->is_array()) fail("topology file {}: collectives must be an array", path);
    for (size_t i = 0; i < it->size(); ++i)
      t.collectives.push_back(sample((*it)[i], i, t.ranks, path));
  }
  if (auto it = doc.find("islands"); it != doc.end()) {
    if (!it->is_array()) fail("topology file {}: islands must be an array of arrays", path);
    std::vector<int> seen(size_t(t.ranks), 0);
    for (size_t i = 0; i < it->size(); ++i) {
      const json& island = (*it)[i];
      if (!island.is_array() || island.empty())
        fail("topology file {}: islands[{}] must be a non-empty array of ranks", path, i);
      std::vector<int> ranks;
      for (size_t j = 0; j < island.size(); ++j) {
        const int r = integer(island[j], fmt::format("islands[{}][{}]", i, j), path);
        if (r < 0 || r >= t.ranks || seen[size_t(r)]++)
          fail("topology file {}: islands[{}][{}] = {} is {}", path, i, j, r,
               r < 0 || r >= t.ranks ? fmt::format("not a rank of 0..{}", t.ranks - 1)
                                     : std::string("in two islands"));
        ranks.push_back(r);
      }
      t.islands.push_back(std::move(ranks));
    }
    if (!t.islands.empty())
      for (int r = 0; r < t.ranks; ++r)
        if (!seen[size_t(r)])
          fail("topology file {}: islands leave out rank {} (each rank is in one island)", path, r);
  }
  if (auto it = doc.find("host_links"); it != doc.end()) {
    if (!it->is_array()) fail("topology file {}: host_links must be an array", path);
    for (size_t i = 0; i < it->size(); ++i) {
      const json& l = (*it)[i];
      const std::string where = fmt::format("host_links[{}]", i);
      if (!l.is_object()) fail("topology file {}: {} must be an object", path, where);
      HostLink link;
      for (auto [key, host] : {std::pair{"host_a", &link.host_a}, {"host_b", &link.host_b}}) {
        const json& v = field(l, key, where, path);
        if (!v.is_string()) fail("topology file {}: {}.{} must be a string", path, where, key);
        *host = v.get<std::string>();
      }
      for (auto [key, rank] : {std::pair{"rank_a", &link.rank_a}, {"rank_b", &link.rank_b}}) {
        *rank = integer(field(l, key, where, path), where + "." + key, path);
        if (*rank < 0 || *rank >= t.ranks)
          fail("topology file {}: {}.{} = {} is not a rank of 0..{}", path, where, key, *rank,
               t.ranks - 1);
      }
      for (auto [key, value, scale] : {std::tuple{"latency_us", &link.latency_s, 1e-6},
                                       {"bandwidth_gbs", &link.bandwidth_Bps, 1e9}}) {
        const json& v = field(l, key, where, path);
        if (!v.is_number() || v.get<double>() <= 0)
          fail("topology file {}: {}.{} must be a positive number, not {}", path, where, key,
               v.dump());
        *value = v.get<double>() * scale;
      }
      t.host_links.push_back(link);
    }
  }
  return t;
}

void Topology::write(const std::string& path) const {
  std::vector<json> latency, bandwidth, island_items;
  std::vector<nlohmann::ordered_json> samples;
  for (const json& row : matrix_json(latency_s, 1e6)) latency.push_back(row);
  for (const json& row : matrix_json(bandwidth_Bps, 1e-9)) bandwidth.push_back(row);
  for (const CollectiveSample& s : collectives)
    samples.push_back(nlohmann::ordered_json{{"op", collective_name(s.op)},
                                             {"size", s.size},
                                             {"stride", s.stride},
                                             {"bytes", s.bytes},
                                             {"seconds", rounded(s.seconds)},
                                             {"bus_gbs", rounded(s.bus_gbs)}});
  for (const auto& island : islands) island_items.push_back(json(island));
  std::vector<nlohmann::ordered_json> links;
  for (const HostLink& l : host_links)
    links.push_back(nlohmann::ordered_json{{"host_a", l.host_a},
                                           {"host_b", l.host_b},
                                           {"rank_a", l.rank_a},
                                           {"rank_b", l.rank_b},
                                           {"latency_us", rounded(l.latency_s * 1e6)},
                                           {"bandwidth_gbs", rounded(l.bandwidth_Bps * 1e-9)}});
  std::ostringstream text;
  text << "{\n  \"version\": " << kVersion << ",\n  \"ranks\": " << ranks
       << ",\n  \"hosts\": " << json(hosts).dump() << ",\n  \"latency_us\": " << rows(latency)
       << ",\n  \"bandwidth_gbs\": " << rows(bandwidth) << ",\n  \"collectives\": " << rows(samples)
       << ",\n  \"islands\": " << rows(island_items);
  if (!links.empty()) text << ",\n  \"host_links\": " << rows(links);
  text << "\n}\n";
  std::ofstream out(path);
  if (!out) fail("cannot write topology file {}: {}", path, std::strerror(errno));
  out << text.str();
  out.close();
  if (!out) fail("cannot write topology file {}: {}", path, std::strerror(errno));
}

void Topology::check_ranks(int world_size, const std::string& path) const {
  if (ranks != world_size)
    fail(
        "topology file {} was measured on {} ranks, but this job has {}: measure this job's "
        "ranks with `mpirun -np {} pentad probe -o {}`",
        path, ranks, world_size, world_size, path);
}

// One step of a ring in group order: every rank sends `chunk` bytes to the next, so the
// step lasts as long as the ring's slowest link takes for it (alpha + chunk / beta).
double Topology::ring_step_seconds(const std::vector<int>& group, double chunk) const {
  const size_t p = group.size();
  double seconds = 0;
  for (size_t i = 0; i < p; ++i) {
    const size_t a = size_t(group[i]), b = size_t(group[(i + 1) % p]);
    seconds = std::max(seconds, latency_s[a][b] + chunk / bandwidth_Bps[a][b]);
  }
  return seconds;
}

double Topology::ring_latency(CollectiveOp op, const std::vector<int>& group) const {
  return ring_steps(op, int(group.size()), 0.0).first * ring_step_seconds(group, 0.0);
}

void Topology::slow_link(int a, int b, double factor) {
  PENTAD_CHECK(a >= 0 && a < ranks && b >= 0 && b < ranks && a != b && factor >= 1,
               "slow_link({}, {}, {}) on a topology of {} ranks", a, b, factor, ranks);
  for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    bandwidth_Bps[size_t(x)][size_t(y)] /= factor;
    latency_s[size_t(x)][size_t(y)] *= factor;
  }
  slowed.push_back({a, b, factor});
}

double Topology::collective_seconds(CollectiveOp op, const std::vector<int>& group,
                                    double bytes) const {
  const int p = int(group.size());
  if (p <= 1 || bytes <= 0) return 0.0;
  for (int r : group)
    PENTAD_CHECK(r >= 0 && r < ranks, "collective_seconds: rank {} of a topology of {}", r, ranks);
  // A slowed link between neighbours of the group's ring: its samples, measured before, do
  // not hold; the ring over the links does.
  for (const SlowLink& l : slowed)
    for (int i = 0; i < p; ++i) {
      const int x = group[size_t(i)], y = group[size_t((i + 1) % p)];
      if ((x == l.a && y == l.b) || (x == l.b && y == l.a)) {
        const auto [steps, chunk] = ring_steps(op, p, bytes);
        return steps * ring_step_seconds(group, chunk);
      }
    }
  // The group's stride, if its ranks are evenly spaced (the mesh's groups are).
  int stride = group[1] - group[0];
  for (int i = 1; i < p; ++i)
    if (group[size_t(i)] - group[size_t(i - 1)] != stride) stride = 0;
  std::vector<const CollectiveSample*> same;
  for (const CollectiveSample& s : collectives)
    if (s.op == op && s.size == p && s.stride == stride && stride > 0) same.push_back(&s);
  if (!same.empty()) {
    std::sort(same.begin(), same.end(), [](const CollectiveSample* a, const CollectiveSample* b) {
      return a->bytes < b->bytes;
    });
    const CollectiveSample& lo = *same.front();
    const CollectiveSample& hi = *same.back();
    // Below the smallest sample: the ring's latency (its steps over the group's measured
    // point-to-point latencies) plus the rest of that sample's time scaled by the bytes, so a
    // small collective is not priced like the smallest one measured (--quick measures one
    // size only). Above the largest, the time grows at the largest sample's bandwidth.
    if (bytes <= lo.bytes) {
      const double alpha = std::min(lo.seconds, ring_latency(op, group));
      return alpha + (lo.seconds - alpha) * bytes / lo.bytes;
    }
    if (bytes >= hi.bytes) return hi.seconds + (bytes - hi.bytes) * hi.seconds / hi.bytes;
    for (size_t i = 1; i < same.size(); ++i) {
      const CollectiveSample& a = *same[i - 1];
      const CollectiveSample& b = *same[i];
      if (bytes > b.bytes) continue;
      if (b.bytes <= a.bytes) return b.seconds;
      const double f = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
      return std::exp(std::log(a.seconds) + f * (std::log(b.seconds) - std::log(a.seconds)));
    }
    return hi.seconds;
  }
  // A ring in group order.
  const auto [steps, chunk] = ring_steps(op, p, bytes);
  return steps * ring_step_seconds(group, chunk);
}

Topology uniform_cluster(int nodes, int per_node, double intra_gbs, double intra_latency_s,
                         double inter_gbs, double inter_latency_s) {
  if (nodes < 1 || per_node < 1)
    fail("a cluster needs at least one node of at least one rank (got {} x {})", nodes, per_node);
  if (!(intra_gbs > 0) || !(inter_gbs > 0) || intra_latency_s < 0 || inter_latency_s < 0)
    fail(
        "a cluster's bandwidths must be above 0 and its latencies at least 0 (got {} and {} "
        "GB/s, {} and {} s)",
        intra_gbs, inter_gbs, intra_latency_s, inter_latency_s);
  Topology t;
  t.ranks = nodes * per_node;
  const size_t n = size_t(t.ranks);
  t.latency_s.assign(n, std::vector<double>(n, 0.0));
  t.bandwidth_Bps.assign(n, std::vector<double>(n, 0.0));
  for (int r = 0; r < t.ranks; ++r) {
    t.hosts.push_back(fmt::format("node{}", r / per_node));
    for (int s = 0; s < t.ranks; ++s) {
      if (r == s) continue;
      const bool same = r / per_node == s / per_node;
      t.latency_s[size_t(r)][size_t(s)] = same ? intra_latency_s : inter_latency_s;
      t.bandwidth_Bps[size_t(r)][size_t(s)] = 1e9 * (same ? intra_gbs : inter_gbs);
    }
  }
  for (int node = 0; node < nodes; ++node) {
    std::vector<int> island;
    for (int i = 0; i < per_node; ++i) island.push_back(node * per_node + i);
    t.islands.push_back(std::move(island));
  }
  return t;
}

}  // namespace pentad::parallel
