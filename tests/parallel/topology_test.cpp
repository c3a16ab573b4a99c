// Topology files (parallel/topology.h): a round trip through JSON, each malformed field refused
// with the file and the field named, the ring model and the interpolation of measured samples
// by hand, and PENTAD_SIM_NODES's parsing. No communication: it runs as one rank.
#include "parallel/topology.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "parallel/comm.h"

namespace pentad::parallel {
namespace {

// A file of this rank's own (the program may run under mpirun).
std::string temp_path(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return ::testing::TempDir() + "topology_test_r" + std::to_string(rank) + "_" + name;
}

std::string write_text(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path) << text;
  return path;
}

// The message of the pentad::Error that `f` throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A valid file of two ranks, with `field` replaced by `value` (JSON text), or left out when
// `value` is empty.
std::string two_ranks_with(const std::string& field, const std::string& value) {
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"version", "1"},
      {"ranks", "2"},
      {"hosts", R"(["a", "b"])"},
      {"latency_us", "[[0, 5], [5, 0]]"},
      {"bandwidth_gbs", "[[0, 10], [10, 0]]"},
      {"collectives",
       R"([{"op": "all_reduce", "size": 2, "stride": 1, "bytes": 1024, "seconds": 1e-5,
            "bus_gbs": 0.1}])"},
      {"islands", "[[0, 1]]"},
      {"host_links",
       R"([{"host_a": "a", "host_b": "b", "rank_a": 0, "rank_b": 1, "latency_us": 12,
            "bandwidth_gbs": 0.117}])"}};
  std::string text = "{";
  for (const auto& [key, json] : fields) {
    const std::string v = key == field ? value : json;
    if (v.empty()) continue;
    if (text.size() > 1) text += ", ";
    text += "\"" + key + "\": " + v;
  }
  return text + "}";
}

void expect_refused(const std::string& name, const std::string& text,
                    const std::vector<std::string>& words) {
  const std::string path = write_text(name + ".json", text);
  const std::string message = error_of([&] { Topology::read(path); });
  ASSERT_FALSE(message.empty()) << name << ": accepted " << text;
  EXPECT_NE(message.find(path), std::string::npos) << name << ": " << message;
  for (const std::string& w : words)
    EXPECT_NE(message.find(w), std::string::npos) << name << ": '" << w << "' not in " << message;
  std::remove(path.c_str());
}

TEST(Topology, WritesAndReadsBack) {
  Topology t = uniform_cluster(2, 2, 100.0, 2e-6, 12.5, 8e-6);
  t.collectives.push_back(CollectiveSample{CollectiveOp::AllGather, 2, 2, 65536, 3.25e-5, 1.0});
  const std::string path = temp_path("round_trip.json");
  t.write(path);
  const Topology back = Topology::read(path);
  EXPECT_EQ(back.ranks, 4);
  EXPECT_EQ(back.hosts, (std::vector<std::string>{"node0", "node0", "node1", "node1"}));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(back.latency_s[i][j], t.latency_s[i][j], 1e-12) << i << " " << j;
      EXPECT_NEAR(back.bandwidth_Bps[i][j], t.bandwidth_Bps[i][j], 1e-3) << i << " " << j;
    }
  ASSERT_EQ(back.collectives.size(), 1u);
  EXPECT_EQ(back.collectives[0].op, CollectiveOp::AllGather);
  EXPECT_EQ(back.collectives[0].stride, 2);
  EXPECT_EQ(back.collectives[0].bytes, 65536);
  EXPECT_DOUBLE_EQ(back.collectives[0].seconds, 3.25e-5);
  EXPECT_EQ(back.islands, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_TRUE(back.host_links.empty());
  std::remove(path.c_str());
  // The links between hosts, measured alone (pentad probe on several hosts).
  t.host_links.push_back({"node0", "node1", 0, 2, 8e-6, 1.17e8});
  t.write(path);
  const Topology linked = Topology::read(path);
  ASSERT_EQ(linked.host_links.size(), 1u);
  EXPECT_EQ(linked.host_links[0].host_a, "node0");
  EXPECT_EQ(linked.host_links[0].host_b, "node1");
  EXPECT_EQ(linked.host_links[0].rank_b, 2);
  EXPECT_NEAR(linked.host_links[0].latency_s, 8e-6, 1e-12);
  EXPECT_NEAR(linked.host_links[0].bandwidth_Bps, 1.17e8, 1.0);
  std::remove(path.c_str());
  // The hand-written minimum: no samples, no islands.
  const std::string bare = write_text("bare.json", two_ranks_with("collectives", ""));
  EXPECT_TRUE(Topology::read(bare).collectives.empty());
  std::remove(bare.c_str());
}

TEST(Topology, RefusesMalformedFilesNamingTheField) {
  expect_refused("version", two_ranks_with("version", "2"), {"version 2", "version 1"});
  expect_refused("no_latency", two_ranks_with("latency_us", ""), {"no field 'latency_us'"});
  expect_refused("latency_rows", two_ranks_with("latency_us", "[[0, 5]]"),
                 {"latency_us", "1 rows", "2 x 2"});
  expect_refused("latency_row", two_ranks_with("latency_us", "[[0, 5], [5]]"),
                 {"latency_us", "row 1 of 1 entries", "2 x 2"});
  expect_refused("negative_bandwidth", two_ranks_with("bandwidth_gbs", "[[0, -1], [10, 0]]"),
                 {"bandwidth_gbs[0][1]", "negative"});
  expect_refused("zero_bandwidth", two_ranks_with("bandwidth_gbs", "[[0, 10], [0, 0]]"),
                 {"bandwidth_gbs[1][0]", "above 0"});
  expect_refused("text_latency", two_ranks_with("latency_us", R"([[0, "5"], [5, 0]])"),
                 {"latency_us[0][1]", "must be a number"});
  expect_refused("hosts", two_ranks_with("hosts", R"(["a"])"),
                 {"hosts", "one host per rank (2)", "1 entries"});
  expect_refused("ranks", two_ranks_with("ranks", "0"), {"ranks = 0"});
  expect_refused("op", two_ranks_with("collectives", R"([{"op": "allreduce", "size": 2, "stride": 1,
                                "bytes": 1, "seconds": 1, "bus_gbs": 1}])"),
                 {"collectives[0].op", "'allreduce'", "all_reduce"});
  expect_refused("stride",
                 two_ranks_with("collectives", R"([{"op": "all_reduce", "size": 2, "stride": 2,
                                "bytes": 1, "seconds": 1, "bus_gbs": 1}])"),
                 {"collectives[0]", "stride 2"});
  expect_refused("seconds",
                 two_ranks_with("collectives", R"([{"op": "all_reduce", "size": 2, "stride": 1,
                                "bytes": 1, "bus_gbs": 1}])"),
                 {"collectives[0] has no field 'seconds'"});
  expect_refused("island_twice", two_ranks_with("islands", "[[0, 1], [1]]"),
                 {"islands[1][0] = 1", "in two islands"});
  expect_refused("island_missing", two_ranks_with("islands", "[[0]]"),
                 {"islands leave out rank 1"});
  expect_refused("island_rank", two_ranks_with("islands", "[[0, 1, 2]]"),
                 {"islands[0][2] = 2", "not a rank"});
  expect_refused("host_link_rank",
                 two_ranks_with("host_links", R"([{"host_a": "a", "host_b": "b", "rank_a": 0,
                                "rank_b": 2, "latency_us": 12, "bandwidth_gbs": 0.1}])"),
                 {"host_links[0].rank_b = 2", "not a rank"});
  expect_refused("host_link_rate",
                 two_ranks_with("host_links", R"([{"host_a": "a", "host_b": "b", "rank_a": 0,
                                "rank_b": 1, "latency_us": 12, "bandwidth_gbs": 0}])"),
                 {"host_links[0].bandwidth_gbs", "positive"});
  expect_refused("host_link_host", two_ranks_with("host_links", R"([{"host_a": "a"}])"),
                 {"host_links[0] has no field 'host_b'"});
  expect_refused("not_json", "{\"version\": 1,", {"not valid JSON"});
  const std::string missing = temp_path("missing.json");
  EXPECT_NE(error_of([&] { Topology::read(missing); }).find("cannot read topology file"),
            std::string::npos);
}

TEST(Topology, CheckRanksNamesTheFileAndBothCounts) {
  const Topology t = uniform_cluster(1, 4, 10, 1e-6, 10, 1e-6);
  EXPECT_EQ(error_of([&] { t.check_ranks(4, "t.json"); }), "");
  const std::string message = error_of([&] { t.check_ranks(8, "t.json"); });
  EXPECT_NE(message.find("t.json was measured on 4 ranks, but this job has 8"), std::string::npos)
      << message;
  EXPECT_NE(error_of([] { uniform_cluster(0, 4, 10, 1e-6, 10, 1e-6); }), "");
  EXPECT_NE(error_of([] { uniform_cluster(2, 4, 10, 1e-6, 0, 1e-6); }), "");
}

TEST(Topology, RingModelTakesTheSlowestLinkOfTheRing) {
  // Two nodes of two: 100 GB/s and 1 us inside, 10 GB/s and 10 us between.
  const Topology t = uniform_cluster(2, 2, 100.0, 1e-6, 10.0, 10e-6);
  const double bytes = 4e6;
  // Inside a node, p = 2: all_reduce 2 steps, the others 1 step, of bytes / 2.
  const double inside_step = 1e-6 + 2e6 / 100e9;
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllReduce, {0, 1}, bytes), 2 * inside_step);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllGather, {2, 3}, bytes), inside_step);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::ReduceScatter, {0, 1}, bytes), inside_step);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllToAll, {0, 1}, bytes), inside_step);
  // Across nodes the ring's crossing edges set every step: p = 4, chunks of bytes / 4.
  const double across_step = 10e-6 + 1e6 / 10e9;
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllReduce, {0, 1, 2, 3}, bytes),
                   6 * across_step);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllGather, {0, 1, 2, 3}, bytes),
                   3 * across_step);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllToAll, {0, 2}, bytes), 10e-6 + 2e6 / 10e9);
  EXPECT_EQ(t.collective_seconds(CollectiveOp::AllReduce, {3}, bytes), 0.0);
}

TEST(Topology, SamplesAreInterpolatedLogLogAndExtrapolatedLinearly) {
  Topology t = uniform_cluster(1, 4, 100.0, 1e-6, 100.0, 1e-6);
  // all_reduce over 2 ranks at stride 2: 1e-5 s at 1 KB, 1e-3 s at 100 KB.
  t.collectives.push_back(CollectiveSample{CollectiveOp::AllReduce, 2, 2, 1e5, 1e-3, 0});
  t.collectives.push_back(CollectiveSample{CollectiveOp::AllReduce, 2, 2, 1e3, 1e-5, 0});
  const std::vector<int> g{1, 3};
  EXPECT_NEAR(t.collective_seconds(CollectiveOp::AllReduce, g, 1e4), 1e-4, 1e-12);  // midpoint
  EXPECT_NEAR(t.collective_seconds(CollectiveOp::AllReduce, g, 1e3), 1e-5, 1e-15);
  // Below the smallest sample: the ring's latency (2 steps of 1 us) and the rest of that
  // sample's time scaled by the bytes.
  EXPECT_NEAR(t.collective_seconds(CollectiveOp::AllReduce, g, 10), 2e-6 + 8e-6 * 1e-2, 1e-15);
  // Beyond the largest sample: its bandwidth, 1e5 B / 1e-3 s.
  EXPECT_NEAR(t.collective_seconds(CollectiveOp::AllReduce, g, 3e5), 3e-3, 1e-12);
  // Another stride, size or op: the ring model.
  const double ring = 2 * (1e-6 + 5e3 / 100e9);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllReduce, {0, 1}, 1e4), ring);
  EXPECT_DOUBLE_EQ(t.collective_seconds(CollectiveOp::AllGather, g, 1e4), ring / 2);
}

TEST(SimulatedNodes, ParsesAndRefusesNamingTheVariable) {
  const SimulatedNodes nodes = parse_simulated_nodes("4:200:0.2");
  EXPECT_EQ(nodes.ranks_per_node, 4);
  EXPECT_DOUBLE_EQ(nodes.latency_s, 200e-6);
  EXPECT_DOUBLE_EQ(nodes.bytes_per_second, 0.2e9);
  EXPECT_FALSE(parse_simulated_nodes("").on());
  for (const char* bad : {"4", "4:200", "4:200:0.2:1", "x:200:0.2", "0:200:0.2", "2.5:200:1",
                          "4:-1:0.2", "4:200:0", "4:200:fast", "4::1"}) {
    const std::string message = error_of([&] { parse_simulated_nodes(bad); });
    EXPECT_NE(message.find("PENTAD_SIM_NODES"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find("R:LAT_US:GBS"), std::string::npos) << bad << ": " << message;
  }
}

}  // namespace
}  // namespace pentad::parallel
