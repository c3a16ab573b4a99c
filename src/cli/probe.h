#pragma once
// `pentad probe`: measures a job's links and collectives and writes the topology file
// (parallel/topology.h) that the planner reads. docs/probe.md says what it measures.
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/topology.h"

namespace pentad::probe {

struct ProbeOptions {
  std::string out = "topology.json";
  bool quick = false;  // one size per collective, fewer repetitions: seconds on 8 CPU ranks
};

// Refuses (pentad::Error) an output file whose directory is missing or not writable, before
// anything is measured.
void check_output(const std::string& path);

// Collective over `world` (every rank of the job, MPI backend). Rank 0 prints progress and
// writes options.out; every rank returns the measured topology.
parallel::Topology run_probe(MPI_Comm world, const ProbeOptions& options);

// The summary table: islands, latency and bandwidth inside and between them, collectives.
std::string describe(const parallel::Topology& topology);

// The rest is the pure arithmetic of the above, public for its tests.

// Rounds of a round-robin tournament: every unordered pair (a < b) once, each rank in at
// most one pair a round (a bye when the count is odd).
std::vector<std::vector<std::pair<int, int>>> pair_rounds(int ranks);

// The group shapes a mesh can make on `ranks` ranks: (size, stride) for every size s > 1
// dividing ranks and every stride d with s * d dividing ranks, smallest first.
std::vector<std::pair<int, int>> group_shapes(int ranks);

// Ranks joined by fast links, as connected components. Links are split at the widest gap
// between the sorted bandwidths of all links (each link's slower direction), if that gap is
// a ratio of at least 1 / factor: the links above it are fast; no such gap, one island.
// Not "within a factor of the best link": one lucky measurement would set the bar. And the
// gap must be wide: on 8 ranks sharing 2 cores, links of one host spread over a factor of
// 10 with gaps up to 2.5 between neighbours, while the links between nodes that a host-
// memory probe can tell apart at all (Ethernet, a simulated node) are 5 to 50 times slower.
// Islands are sorted, and ordered by their smallest rank.
std::vector<std::vector<int>> find_islands(const std::vector<std::vector<double>>& bandwidth_Bps,
                                           double factor = 0.25);

}  // namespace pentad::probe
