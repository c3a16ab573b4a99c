// `pentad probe` (cli/probe.h). Three parts, each over Communicator operations only:
//   1. point to point, every ordered pair: one-way latency (half the median round trip of a
//      small message) and bandwidth (a few MiB sent, answered by a small acknowledgement;
//      the two latencies taken off the median time), the pairs in round-robin rounds so that
//      no rank is in two pairs at once;
//   2. collectives, every group shape a mesh can make: all groups of a shape at once, after a
//      barrier of the world, each repetition's time the slowest rank's, the median reported;
//   3. islands: connected components of the fast links;
//   4. with ranks on several hosts, each pair of hosts' link measured alone.
// The summary it prints is cli/probe_report.cpp's.
#include "cli/probe.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <system_error>

#include "cli/command.h"
#include "core/check.h"
#include "core/tensor.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace pentad::probe {
namespace {

using parallel::CollectiveOp;
using parallel::Communicator;
using Clock = std::chrono::steady_clock;

constexpr CollectiveOp kOps[] = {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                                 CollectiveOp::ReduceScatter, CollectiveOp::AllToAll};
constexpr size_t kHostBytes = 256;  // of each rank's host name, for the all-gather

struct Settings {
  int latency_reps, bandwidth_reps, collective_reps;
  double bandwidth_bytes;
  std::vector<double> collective_bytes;  // per rank, topology.h's convention
};

Settings settings_for(bool quick) {
  if (quick) return Settings{10, 5, 5, double(1 << 20), {double(1 << 20)}};
  return Settings{20, 5, 7, double(4 << 20), {double(64 << 10), double(1 << 20), double(8 << 20)}};
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  PENTAD_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Rank 0's progress: a line when `force`d or when 2 s have passed since the last one.
class Progress {
 public:
  explicit Progress(bool on) : on_(on), start_(Clock::now()), last_(start_) {}
  template <typename... Args>
  void line(bool force, fmt::format_string<Args...> format, Args&&... args) {
    if (!on_ || (!force && seconds_since(last_) < 2.0)) return;
    last_ = Clock::now();
    std::printf("probe: %s (%.1f s)\n", fmt::format(format, std::forward<Args>(args)...).c_str(),
                seconds_since(start_));
    std::fflush(stdout);
  }

 private:
  bool on_;
  Clock::time_point start_, last_;
};

struct Link {
  double latency_s = 0, bandwidth_Bps = 0;
};

// One direction of a pair: `lead` measures the link to `peer`, the other side answers. The
// bandwidth from the median transfer, or with `fastest` from the fastest: what the wire can
// do, where the ranks' CPUs are shared with others (a rank descheduled only slows a transfer).
Link measure_link(Communicator& comm, int peer, bool lead, const Settings& s,
                  std::vector<float>& small, std::vector<float>& big, bool fastest = false) {
  const Tensor ping = view_of(small.data(), {int64_t(small.size())});
  const Tensor data = view_of(big.data(), {int64_t(big.size())});
  std::vector<double> round_trips, transfers;
  for (int rep = 0; rep <= s.latency_reps; ++rep) {  // rep 0 warms the connection up
    if (lead) {
      const Clock::time_point t0 = Clock::now();
      comm.send(ping, peer);
      comm.recv(ping, peer);
      if (rep > 0) round_trips.push_back(seconds_since(t0));
    } else {
      comm.recv(ping, peer);
      comm.send(ping, peer);
    }
  }
  for (int rep = 0; rep <= s.bandwidth_reps; ++rep) {
    if (lead) {
      const Clock::time_point t0 = Clock::now();
      comm.send(data, peer);
      comm.recv(ping, peer);
      if (rep > 0) transfers.push_back(seconds_since(t0));
    } else {
      comm.recv(data, peer);
      comm.send(ping, peer);
    }
  }
  if (!lead) return {};
  Link link;
  link.latency_s = 0.5 * median(round_trips);
  // The transfer and its acknowledgement each cost a latency; what remains moved the bytes
  // (at least a quarter of the time, should the latencies' noise exceed the transfer).
  const double t =
      fastest ? *std::min_element(transfers.begin(), transfers.end()) : median(transfers);
  link.bandwidth_Bps = double(data.bytes()) / std::max(t - 2 * link.latency_s, 0.25 * t);
  return link;
}

// Fills `topology`'s matrices: each rank measures its row, then the rows are gathered.
void measure_pairs(Communicator& world, const Settings& s, Progress& progress,
                   parallel::Topology& topology) {
  const int n = world.size(), me = world.rank();
  std::vector<double> latency_row(size_t(n), 0.0), bandwidth_row(size_t(n), 0.0);
  std::vector<float> small(2, 1.0f), big(size_t(s.bandwidth_bytes / sizeof(float)), 1.0f);
  const auto rounds = pair_rounds(n);
  const int pairs = n * (n - 1) / 2;
  int done = 0;
  progress.line(true, "pairs 0/{}: latency and bandwidth of every link", pairs);
  for (const auto& round : rounds) {
    for (const auto& [a, b] : round) {
      if (me != a && me != b) continue;
      const int peer = me == a ? b : a;
      for (int leader : {a, b}) {
        const Link link = measure_link(world, peer, me == leader, s, small, big);
        if (me == leader) {
          latency_row[size_t(peer)] = link.latency_s;
          bandwidth_row[size_t(peer)] = link.bandwidth_Bps;
        }
      }
    }
    done += int(round.size());
    progress.line(false, "pairs {}/{}", done, pairs);
  }
  std::vector<double> latency(size_t(n) * size_t(n)), bandwidth(latency.size());
  world.all_gather(view_of(latency.data(), {int64_t(latency.size())}, DType::F64),
                   view_of(latency_row.data(), {n}, DType::F64));
  world.all_gather(view_of(bandwidth.data(), {int64_t(bandwidth.size())}, DType::F64),
                   view_of(bandwidth_row.data(), {n}, DType::F64));
  topology.latency_s.assign(size_t(n), std::vector<double>(size_t(n)));
  topology.bandwidth_Bps = topology.latency_s;
  for (size_t i = 0; i < size_t(n); ++i)
    for (size_t j = 0; j < size_t(n); ++j) {
      topology.latency_s[i][j] = latency[i * size_t(n) + j];
      topology.bandwidth_Bps[i][j] = bandwidth[i * size_t(n) + j];
    }
}

// Runs one collective of `bytes` (topology.h's convention) on `group`; returns the bytes
// really moved, the element count rounded to a multiple of the group size.
double run_collective(Communicator& group, CollectiveOp op, double bytes, std::vector<float>& a,
                      std::vector<float>& b) {
  const int64_t p = group.size();
  const int64_t n = std::max<int64_t>(p, int64_t(bytes / sizeof(float)) / p * p);
  const Tensor full_a = view_of(a.data(), {n}), full_b = view_of(b.data(), {n});
  const Tensor part_b = view_of(b.data(), {n / p});
  switch (op) {
    case CollectiveOp::AllReduce:
      group.all_reduce(full_a);
      break;
    case CollectiveOp::AllGather:
      group.all_gather(full_a, part_b);
      break;
    case CollectiveOp::ReduceScatter:
      group.reduce_scatter(part_b, full_a);
      break;
    case CollectiveOp::AllToAll:
      group.all_to_all(full_b, full_a);
      break;
  }
  return double(n) * sizeof(float);
}

// nccl-tests' bus bandwidth: the algorithm bandwidth (bytes / time) times the share of the
// data a rank must move over its links.
double bus_gbs(CollectiveOp op, int p, double bytes, double seconds) {
  const double factor = op == CollectiveOp::AllReduce ? 2.0 * (p - 1) / p : double(p - 1) / p;
  return bytes / seconds * factor * 1e-9;
}

void measure_collectives(MPI_Comm world_comm, Communicator& world, const Settings& s,
                         Progress& progress, parallel::Topology& topology) {
  const int n = world.size();
  const auto shapes = group_shapes(n);
  const double largest = *std::max_element(s.collective_bytes.begin(), s.collective_bytes.end());
  std::vector<float> a(size_t(largest / sizeof(float)) + size_t(n), 1.0f), b(a.size(), 1.0f);
  progress.line(true, "collectives: {} group shapes x {} ops x {} sizes", shapes.size(),
                std::size(kOps), s.collective_bytes.size());
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto [size, stride] = shapes[k];
    // The mesh makes the groups: tp = stride puts `size` dp ranks `stride` apart.
    parallel::MeshConfig config;
    config.tp = stride;
    config.dp = size;
    config.pp = n / (size * stride);
    parallel::Mesh mesh = parallel::Mesh::create(config, world_comm);
    Communicator& group = mesh.group(parallel::Axis::DP);
    // Each repetition's time on this rank, then the slowest rank's, for every op and size.
    std::vector<double> times;
    std::vector<double> moved;
    for (CollectiveOp op : kOps)
      for (double bytes : s.collective_bytes) {
        for (int rep = 0; rep <= s.collective_reps; ++rep) {  // rep 0: warm-up
          world.barrier();
          const Clock::time_point t0 = Clock::now();
          const double really = run_collective(group, op, bytes, a, b);
          if (rep > 0) times.push_back(seconds_since(t0));
          if (rep == 0) moved.push_back(really);
        }
        progress.line(false, "collectives: shape {}/{} (size {} stride {}), {}", k + 1,
                      shapes.size(), size, stride, parallel::collective_name(op));
      }
    world.all_reduce(view_of(times.data(), {int64_t(times.size())}, DType::F64),
                     parallel::ReduceOp::Max);
    size_t at = 0, m = 0;
    for (CollectiveOp op : kOps)
      for (size_t j = 0; j < s.collective_bytes.size(); ++j, ++m) {
        std::vector<double> reps(times.begin() + long(at),
                                 times.begin() + long(at) + s.collective_reps);
        at += size_t(s.collective_reps);
        parallel::CollectiveSample sample;
        sample.op = op;
        sample.size = size;
        sample.stride = stride;
        sample.bytes = moved[m];
        sample.seconds = median(reps);
        sample.bus_gbs = bus_gbs(op, size, sample.bytes, sample.seconds);
        topology.collectives.push_back(sample);
      }
  }
  progress.line(true, "collectives: shape {}/{}", shapes.size(), shapes.size());
}

// Each pair of hosts: their first ranks measure the link between them alone (the pair
// matrix's rounds run pairs at once, so its pairs between two hosts share the wire), both
// directions, the slower kept, each from its fastest transfer; every other rank waits at a
// barrier.
void measure_host_links(Communicator& world, const Settings& s, Progress& progress,
                        parallel::Topology& topology) {
  std::vector<int> firsts;  // each host's first rank, in rank order
  for (int r = 0; r < topology.ranks; ++r)
    if (std::find(topology.hosts.begin(), topology.hosts.begin() + r, topology.hosts[size_t(r)]) ==
        topology.hosts.begin() + r)
      firsts.push_back(r);
  if (firsts.size() < 2) return;
  // 4 MiB and twice the repetitions even when quick: one link a pair of hosts, not n^2.
  Settings alone = s;
  alone.bandwidth_bytes = std::max(s.bandwidth_bytes, double(4 << 20));
  alone.bandwidth_reps = 2 * s.bandwidth_reps;
  std::vector<float> small(2, 1.0f), big(size_t(alone.bandwidth_bytes / sizeof(float)), 1.0f);
  const int me = world.rank();
  progress.line(true, "host links: {} pairs of hosts, one at a time",
                firsts.size() * (firsts.size() - 1) / 2);
  for (size_t i = 0; i < firsts.size(); ++i)
    for (size_t j = i + 1; j < firsts.size(); ++j) {
      const int a = firsts[i], b = firsts[j];
      world.barrier();
      double measured[2] = {0, 0};  // latency, bandwidth of the slower direction (at a)
      if (me == a || me == b) {
        Link slower{0, std::numeric_limits<double>::max()};
        for (int leader : {a, b}) {
          const Link l =
              measure_link(world, me == a ? b : a, me == leader, alone, small, big, true);
          if (me != leader) continue;
          double mine[2] = {l.latency_s, l.bandwidth_Bps};
          if (me == b) world.send(view_of(mine, {2}, DType::F64), a);
          if (me == a) {
            slower = {std::max(slower.latency_s, l.latency_s),
                      std::min(slower.bandwidth_Bps, l.bandwidth_Bps)};
          }
        }
        if (me == a) {
          double theirs[2];
          world.recv(view_of(theirs, {2}, DType::F64), b);
          measured[0] = std::max(slower.latency_s, theirs[0]);
          measured[1] = std::min(slower.bandwidth_Bps, theirs[1]);
        }
      }
      world.broadcast(view_of(measured, {2}, DType::F64), a);
      topology.host_links.push_back(
          {topology.hosts[size_t(a)], topology.hosts[size_t(b)], a, b, measured[0], measured[1]});
      progress.line(false, "host links: {} - {}", topology.hosts[size_t(a)],
                    topology.hosts[size_t(b)]);
    }
}

std::vector<std::string> gather_hosts(Communicator& world) {
  std::vector<char> mine(kHostBytes, '\0');
  if (gethostname(mine.data(), kHostBytes - 1) != 0) std::strcpy(mine.data(), "unknown");
  mine.back() = '\0';
  const int n = world.size();
  std::vector<int32_t> in(kHostBytes / sizeof(int32_t)), all(in.size() * size_t(n));
  std::memcpy(in.data(), mine.data(), kHostBytes);
  world.all_gather(view_of(all.data(), {int64_t(all.size())}, DType::I32),
                   view_of(in.data(), {int64_t(in.size())}, DType::I32));
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) {
    const char* name = reinterpret_cast<const char*>(all.data() + size_t(r) * in.size());
    hosts.emplace_back(name, strnlen(name, kHostBytes));
  }
  return hosts;
}

}  // namespace

void check_output(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  if (path.empty() || fs::is_directory(file, ec))
    fail("probe -o '{}': name a file to write, not a directory", path);
  if (!fs::is_directory(dir, ec))
    fail("probe -o {}: the directory {} does not exist (create it first)", path, dir.string());
  if (access(dir.c_str(), W_OK) != 0)
    fail("probe -o {}: the directory {} is not writable", path, dir.string());
}

std::vector<std::vector<std::pair<int, int>>> pair_rounds(int ranks) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (ranks < 2) return rounds;
  // The circle method: player m-1 stays, the others rotate one place a round.
  const int m = ranks % 2 ? ranks + 1 : ranks;
  for (int r = 0; r < m - 1; ++r) {
    std::vector<std::pair<int, int>> round;
    const auto add = [&](int x, int y) {
      if (x < ranks && y < ranks) round.emplace_back(std::min(x, y), std::max(x, y));
    };
    add(m - 1, r);
    for (int k = 1; k < m / 2; ++k) add((r + k) % (m - 1), (r - k + m - 1) % (m - 1));
    std::sort(round.begin(), round.end());
    rounds.push_back(std::move(round));
  }
  return rounds;
}

std::vector<std::pair<int, int>> group_shapes(int ranks) {
  std::vector<std::pair<int, int>> shapes;
  for (int size = 2; size <= ranks; ++size) {
    if (ranks % size) continue;
    for (int stride = 1; size * stride <= ranks; ++stride)
      if (ranks % (size * stride) == 0) shapes.emplace_back(size, stride);
  }
  return shapes;
}

std::vector<std::vector<int>> find_islands(const std::vector<std::vector<double>>& bandwidth_Bps,
                                           double factor) {
  const int n = int(bandwidth_Bps.size());
  const auto link = [&](int i, int j) {
    return std::min(bandwidth_Bps[size_t(i)][size_t(j)], bandwidth_Bps[size_t(j)][size_t(i)]);
  };
  std::vector<double> links;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) links.push_back(link(i, j));
  std::sort(links.begin(), links.end());
  double bar = 0, widest = 1.0 / factor;  // a gap narrower than 1 / factor splits nothing
  for (size_t k = 1; k < links.size(); ++k) {
    const double ratio = links[k - 1] > 0 ? links[k] / links[k - 1] : HUGE_VAL;
    if (ratio >= widest) {
      widest = ratio;
      bar = links[k];
    }
  }
  std::vector<int> parent(static_cast<size_t>(n));
  std::iota(parent.begin(), parent.end(), 0);
  const auto root = [&](int i) {
    while (parent[size_t(i)] != i) i = parent[size_t(i)] = parent[size_t(parent[size_t(i)])];
    return i;
  };
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (link(i, j) >= bar) parent[size_t(root(j))] = root(i);
  std::vector<std::vector<int>> islands;
  std::vector<int> index(size_t(n), -1);
  for (int i = 0; i < n; ++i) {  // in rank order: islands come sorted, by smallest rank
    int& k = index[size_t(root(i))];
    if (k < 0) {
      k = int(islands.size());
      islands.emplace_back();
    }
    islands[size_t(k)].push_back(i);
  }
  return islands;
}

parallel::Topology run_probe(MPI_Comm world_comm, const ProbeOptions& options) {
  std::unique_ptr<Communicator> world =
      parallel::make_communicator(parallel::Backend::MPI, world_comm, "probe");
  const Settings s = settings_for(options.quick);
  Progress progress(world->rank() == 0);
  parallel::Topology topology;
  topology.ranks = world->size();
  topology.hosts = gather_hosts(*world);
  measure_pairs(*world, s, progress, topology);
  measure_host_links(*world, s, progress, topology);
  measure_collectives(world_comm, *world, s, progress, topology);
  topology.islands = find_islands(topology.bandwidth_Bps);
  if (world->rank() == 0) {
    topology.write(options.out);
    progress.line(true, "wrote {}", options.out);
  }
  return topology;
}

}  // namespace pentad::probe

namespace pentad::cli {

void add_probe_command(Commands& commands) {
  auto& options = commands.keep<probe::ProbeOptions>();
  CLI::App* probe = commands.app().add_subcommand(
      "probe",
      "Measure the links and collectives of this job's ranks (run under mpirun) and "
      "write a topology file for the planner (docs/probe.md)");
  probe->add_option("-o,--out", options.out, "Topology file to write")->capture_default_str();
  probe->add_flag("--quick", options.quick,
                  "One size per collective and fewer repetitions: seconds, for tests");
  commands.add(probe, [&options](const Job& job) {
    // Both refusals before any rank measures: a missing directory, a bad PENTAD_SIM_NODES.
    if (const int status = job.on_every_rank([&] {
          probe::check_output(options.out);
          parallel::simulated_nodes_from_env();
        }))
      return status;
    if (job.rank != 0) spdlog::set_level(spdlog::level::warn);
    const parallel::Topology topology = probe::run_probe(MPI_COMM_WORLD, options);
    if (job.rank == 0) std::fputs(probe::describe(topology).c_str(), stdout);
    return 0;
  });
}

}  // namespace pentad::cli
