// The machines the planner knows (plan/cost_model.h): GPU cluster presets from vendors'
// datasheets, and this CPU machine from its kernel table.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/check.h"
#include "plan/cost_model.h"

namespace pentad {
namespace {

struct Preset {
  const char* name;
  int gpus_per_node;
  double memory_gb;    // HBM per GPU (GB = 1e9 bytes)
  double peak_tflops;  // dense bf16 per GPU
  double hbm_tbs;      // memory bandwidth per GPU
  double nvlink_gbs;   // NVSwitch, per GPU per direction
  double ib_gbs;       // InfiniBand per GPU per direction (one NIC per GPU)
  double pcie_gbs;     // host link per GPU per direction
};

// NVIDIA DGX A100 datasheet (2020) and A100 datasheet: 8x A100 80GB, 312 TFLOP/s dense
// bf16, 2.0 TB/s HBM2e, NVLink 3 600 GB/s bidirectional per GPU through NVSwitch (300 per
// direction), 8x 200 Gb/s HDR InfiniBand (25 GB/s per GPU), PCIe 4 x16 (~25 GB/s).
// NVIDIA DGX H100 datasheet (2023) and H100 SXM datasheet: 8x H100 80GB, 989 TFLOP/s dense
// bf16 (1979 with sparsity), 3.35 TB/s HBM3, NVLink 4 900 GB/s bidirectional (450 per
// direction), 8x 400 Gb/s ConnectX-7 NDR (50 GB/s per GPU), PCIe 5 x16 (~50 GB/s).
constexpr Preset kPresets[] = {
    {"dgx-a100", 8, 80, 312, 2.0, 300, 25, 25},
    {"dgx-h100", 8, 80, 989, 3.35, 450, 50, 50},
};
// Link latencies (not on the datasheets): NVSwitch ~3 us, InfiniBand through a switch ~6 us
// per message as NCCL's ring sees them.
constexpr double kNvlinkLatency = 3e-6, kIbLatency = 6e-6;
// A message between ranks of this CPU machine: the receiver woken (Open MPI's shared memory).
constexpr double kCpuLatency = 5e-6;

}  // namespace

Cluster cluster_preset(const std::string& spec, int ranks) {
  const std::string name = spec.substr(0, spec.find(':'));
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (name == p.name) preset = &p;
  if (!preset)
    fail(
        "--cluster {}: unknown cluster; the presets are dgx-a100 and dgx-h100 (optionally "
        ":NODES, e.g. dgx-h100:96), or give --topology FILE",
        spec);
  int nodes = (ranks + preset->gpus_per_node - 1) / preset->gpus_per_node;
  if (spec.find(':') != std::string::npos) {
    char rest = 0;
    if (std::sscanf(spec.c_str() + spec.find(':') + 1, "%d%c", &nodes, &rest) != 1 || nodes < 1)
      fail("--cluster {}: NODES after ':' must be a positive integer", spec);
    if (int64_t(nodes) * preset->gpus_per_node < ranks)
      fail("--cluster {}: {} nodes of {} GPUs hold {} ranks, fewer than --ranks {}", spec, nodes,
           preset->gpus_per_node, nodes * preset->gpus_per_node, ranks);
  }
  Cluster c;
  Machine& m = c.machine;
  m.name = fmt::format("{} x{} ({} GPUs)", preset->name, nodes, nodes * preset->gpus_per_node);
  m.gpu = true;
  m.ranks_per_node = preset->gpus_per_node;
  m.memory_bytes = preset->memory_gb * 1e9;
  m.peak_flops = preset->peak_tflops * 1e12;
  m.memory_Bps = preset->hbm_tbs * 1e12;
  m.host_link_Bps = preset->pcie_gbs * 1e9;
  const int per_node = std::min(preset->gpus_per_node, ranks);
  c.topology =
      parallel::uniform_cluster((ranks + per_node - 1) / per_node, per_node, preset->nvlink_gbs,
                                kNvlinkLatency, preset->ib_gbs, kIbLatency);
  return c;
}

Engine engine_named(const std::string& name) {
  Engine e;
  e.name = name;
  if (name == "pentad") return e;
  if (name != "megatron-core")
    fail("--engine {}: unknown; the engines are pentad (the default) and megatron-core", name);
  e.param_gather_in_compute_type = true;
  e.param_gather_overlapped = true;
  e.tp_comm_overlapped = true;
  return e;
}

double gpu_peak_flops(const std::string& device_name) {
  // Dense bf16 tensor-core peaks, TFLOP/s, no sparsity (datasheets; bench/torch_gpt2.py
  // keeps the same table): the first row whose words all appear in the name wins.
  struct Peak {
    std::vector<std::string> words;
    double tflops;
  };
  static const Peak kPeaks[] = {
      {{"H200", "NVL"}, 835.0}, {{"H200"}, 989.4}, {{"H100", "PCIe"}, 756.0},
      {{"H100", "NVL"}, 835.0}, {{"H100"}, 989.4}, {{"A100"}, 312.0},
  };
  for (const Peak& p : kPeaks)
    if (std::all_of(p.words.begin(), p.words.end(),
                    [&](const std::string& w) { return device_name.find(w) != std::string::npos; }))
      return p.tflops * 1e12;
  return 0;
}

Cluster this_machine(const Calibration& calibration, int ranks) {
  Cluster c;
  Machine& m = c.machine;
  m.name = fmt::format("this machine ({}, {} cores, calibrated)", calibration.machine,
                       calibration.cores);
  m.gpu = false;
  m.ranks_per_node = ranks;
  m.cores = calibration.cores;
  m.calibration = calibration;
  // Shared-memory messages are copied twice (into the shared segment and out), one core
  // each; latency: a wake-up of the peer.
  const double gbs = calibration.rates.front().copy_bytes_per_s / 2 / 1e9;
  c.topology = parallel::uniform_cluster(1, ranks, gbs, kCpuLatency, gbs, kCpuLatency);
  return c;
}

}  // namespace pentad
