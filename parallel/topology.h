#pragma once
// The measured shape of a job's links: what `pentad probe` writes and what `pentad plan` and
// `parallel.tp_shape = "auto"` read. A topology file is JSON:
//   {"version": 1, "ranks": N, "hosts": [host of rank 0, ...],
//    "latency_us": N x N (one-way, point to point; 0 on the diagonal),
//    "bandwidth_gbs": N x N (GB/s = 1e9 bytes/s, point to point, one direction),
//    "collectives": [{"op": "all_reduce" | "all_gather" | "reduce_scatter" | "all_to_all",
//                     "size": group size, "stride": rank distance within a group,
//                     "bytes": per-rank buffer (all_reduce: the buffer; all_gather: the output;
//                     reduce_scatter: the input; all_to_all: the input), "seconds": median,
//                     "bus_gbs": bus bandwidth as nccl-tests define it}, ...],
//    "islands": [[ranks], ...] (ranks whose links to each other are fast, by bandwidth)}
// A group of a collective is `size` ranks spaced `stride` apart (the mesh's groups: tp
// adjacent at stride 1, dp at stride tp, ...). Simulated nodes (PENTAD_SIM_NODES, comm.h)
// make the CPU backend show the same structure on one machine.
#include <string>
#include <vector>

namespace pentad::parallel {

enum class CollectiveOp { AllReduce, AllGather, ReduceScatter, AllToAll };
const char* collective_name(CollectiveOp op);  // "all_reduce", ...

struct CollectiveSample {
  CollectiveOp op = CollectiveOp::AllReduce;
  int size = 0, stride = 1;
  double bytes = 0, seconds = 0, bus_gbs = 0;
};

// The link between two hosts as one pair of ranks finds it with nothing else on it (the
// pair matrix runs pairs at once, so its pairs between hosts share the wire).
struct HostLink {
  std::string host_a, host_b;               // in the order of their first ranks
  int rank_a = 0, rank_b = 0;               // each host's first rank: the pair that measured it
  double latency_s = 0, bandwidth_Bps = 0;  // the slower direction's
};

// A link found slow (`pentad launch --replan`: the detector's pair and how many times slower
// than its like it ran): its rate divided by `factor`, its latency multiplied.
struct SlowLink {
  int a = 0, b = 0;
  double factor = 1;
};

struct Topology {
  int ranks = 0;
  std::vector<std::string> hosts;                  // per rank
  std::vector<std::vector<double>> latency_s;      // [from][to], seconds
  std::vector<std::vector<double>> bandwidth_Bps;  // [from][to], bytes per second
  std::vector<CollectiveSample> collectives;
  std::vector<std::vector<int>> islands;
  std::vector<HostLink> host_links;  // every pair of hosts (none on one host)
  // Links slowed by slow_link (not in the file): a group whose ring holds one is priced over
  // its links even where samples of its op, size and stride were measured.
  std::vector<SlowLink> slowed;

  // The link between world ranks a and b, both directions, `factor` times slower.
  void slow_link(int a, int b, double factor);

  // Reads and validates a topology file; pentad::Error names the file and the field.
  static Topology read(const std::string& path);
  void write(const std::string& path) const;
  // Throws pentad::Error naming the file if it was measured for another rank count.
  void check_ranks(int world_size, const std::string& path) const;

  // Predicted seconds of one collective over `group` (world ranks, in group order) with
  // `bytes` per rank as in CollectiveSample: from the measured samples of the same op, size
  // and stride when there are any (interpolated in bytes, log-log), else a ring over the
  // group's links (alpha-beta: the slowest link of the ring bounds its bandwidth).
  double collective_seconds(CollectiveOp op, const std::vector<int>& group, double bytes) const;
  // The latency part of a ring collective over `group`: its steps times the ring's slowest
  // point-to-point latency.
  double ring_latency(CollectiveOp op, const std::vector<int>& group) const;

 private:
  // One ring step over `group` moving `chunk` bytes a link: the slowest link's time.
  double ring_step_seconds(const std::vector<int>& group, double chunk) const;
};

// A topology for a cluster preset without measuring: `nodes` nodes of `per_node` ranks;
// links within a node at intra_gbs (GB/s one direction) and intra_latency_s, between nodes
// at inter_gbs per rank and inter_latency_s. Hosts are "node0", "node1", ...
Topology uniform_cluster(int nodes, int per_node, double intra_gbs, double intra_latency_s,
                         double inter_gbs, double inter_latency_s);

}  // namespace pentad::parallel
