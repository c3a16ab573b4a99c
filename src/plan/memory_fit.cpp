// Whether a run's memory plan fits (plan/memory_budget.h): this rank's share of what its
// machine and its job's cgroup allow, the plan in words for `pentad plan`, and the refusal
// naming what would fit. The estimate itself is plan/memory_budget.cpp.
#include <fmt/ranges.h>
#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/cgroup.h"
#include "core/check.h"
#include "core/device_memory.h"
#include "core/tensor.h"
#include "model/moe.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"

namespace pentad {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// format_bytes for sizes past what a size_t holds.
std::string bytes_text(double bytes) {
  if (bytes < 1e18) return format_bytes(size_t(bytes));
  return fmt::format("{:.4g} EiB", bytes / (kMiB * kMiB * kMiB));
}

std::string values_text(const MemoryEstimate& e) {
  if (e.expert_values == 0) return fmt::format("{:.4g} values", e.values);
  return fmt::format("{:.4g} values, {:.4g} of them in routed experts", e.values, e.expert_values);
}

std::string activations_text(const Config& cfg, const MemoryEstimate& e) {
  return fmt::format(
      "micro-batch {} x {}{}, recompute {}{}{}", cfg.train.micro_batch, cfg.train.seq_len,
      cfg.parallel.cp > 1 ? fmt::format(" split over cp {}", cfg.parallel.cp) : "",
      cfg.model.recompute ? "on" : "off", cfg.model.recompute.automatic ? " (auto)" : "",
      e.dispatch > 0
          ? fmt::format(", MoE dispatch buffers {} (worst case{})", bytes_text(e.dispatch),
                        cfg.model.moe.capacity_factor > 0 ? " within capacity" : ", dropless")
          : "");
}

// The limit in bytes and how to say it.
std::pair<double, std::string> memory_limit(const Config& cfg, const NodeShare& node) {
  if (cfg.train.memory_limit_mb > 0)
    return {double(cfg.train.memory_limit_mb) * kMiB,
            fmt::format("train.memory_limit_mb = {}", cfg.train.memory_limit_mb)};
  if (cfg.train.device == "cuda") {
    const double share = node.device_bytes / std::max(1, node.device_ranks);
    return {share, fmt::format("this rank's share of its GPU's memory ({}, {} rank{} on it)",
                               bytes_text(node.device_bytes), node.device_ranks,
                               node.device_ranks == 1 ? "" : "s")};
  }
  const double share = node.memory_bytes / std::max(1, node.ranks);
  return {share, fmt::format("this rank's share of the memory it may use ({}: {} each; "
                             "train.memory_limit_mb = 0 means automatic)",
                             describe_node_memory(node), bytes_text(share))};
}

// The plan fits: the first rank of each machine says what it fits in (each machine may
// have a cgroup of its own), and warns when memory.high, the cgroup's soft bound, is below
// it: the kernel then throttles the job and reclaims its pages, every step slower.
void report_fit(const Config& cfg, const NodeShare& node, const MemoryEstimate& e) {
  if (cfg.train.device != "cpu" || node.memory_bytes <= 0 || node.local_rank != 0) return;
  const int ranks = std::max(1, node.ranks);
  const double high_share = node.memory_high / ranks;
  spdlog::info("memory: {}; the plan needs about {} a rank{}", describe_node_memory(node),
               bytes_text(e.total()),
               node.memory_high > 0
                   ? fmt::format("; soft bound {} from {}", bytes_text(node.memory_high),
                                 node.memory_high_source)
                   : "");
  if (node.memory_high > 0 && e.total() > high_share)
    spdlog::warn(
        "memory: the plan needs about {} a rank, above {}, this rank's share of the soft "
        "bound {} from {} that {} rank{} share: past it the kernel throttles the job and "
        "reclaims its memory, so the steps slow down. To stay below it: a smaller plan "
        "(`pentad plan` shows it), or train.memory_limit_mb = {}, which refuses a plan above "
        "that",
        bytes_text(e.total()), bytes_text(high_share), bytes_text(node.memory_high),
        node.memory_high_source, ranks, ranks == 1 ? "" : "s", int64_t(high_share / kMiB));
}

// The largest value in [lo, hi] for which fits(value) holds, fits being monotone
// (true up to some value); lo - 1 when none fits.
int64_t largest_fitting(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
  if (lo > hi || !fits(lo)) return lo - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace

std::string describe_node_memory(const NodeShare& node) {
  const int ranks = std::max(1, node.ranks);
  return fmt::format("{} from {}, {} rank{} share{} it", bytes_text(node.memory_bytes),
                     node.memory_source.empty() ? "this machine" : node.memory_source, ranks,
                     ranks == 1 ? "" : "s", ranks == 1 ? "s" : "");
}

std::string describe_memory(const Config& cfg, const parallel::MeshConfig& mesh) {
  const MemoryEstimate e = estimate_memory(cfg, mesh);
  const ModelConfig& m = cfg.model;
  std::string text = fmt::format(
      "memory plan (estimate for the rank that needs the most{}; tp {} cp {} dp {} pp {} ep {} "
      "etp {}, {} {}):\n",
      mesh.pp > 1 ? fmt::format(": pipeline stage {}", e.stage) : "", mesh.tp, mesh.cp, mesh.dp,
      mesh.pp, mesh.ep, mesh.etp, cfg.train.device, cfg.train.precision);
  if (mesh.pp > 1)
    text += fmt::format("  layers       {} a chunk, in model order{}\n",
                        fmt::join(pipeline_chunk_layers(cfg, mesh.pp), ", "),
                        cfg.parallel.pp_layout == "balanced" ? " (balanced by FLOPs)" : "");
  text += fmt::format("  parameters   {} ({})\n", bytes_text(e.parameters), values_text(e));
  if (e.expert_values > 0)
    text += fmt::format(
        "    routed experts {} ({} of {} experts per MoE layer, 1/{} of width {} each)\n",
        bytes_text(e.expert_values * e.parameters / e.values), m.n_experts / mesh.ep, m.n_experts,
        mesh.etp, expert_ffn_dim(m));
  // ZeRO's formulas (README, "ZeRO"), N values here, Z = dp x cp, S = N / Z; with MoE,
  // S = Nd / Z + Ne / edp (dense values, routed experts' values).
  const int64_t Z = mesh.dp * mesh.cp, zero = Z > 1 ? cfg.parallel.zero : 0;
  const std::string share =
      e.expert_values > 0
          ? fmt::format(
                "S = Nd / {} + Ne / {}: dense values over dp x cp, routed experts' over edp", Z,
                parallel::mesh_degree(mesh, parallel::Axis::EDP))
          : fmt::format("S = N / {}", Z);
  const bool nvme = cfg.parallel.offload == "nvme";
  const bool cuda = cfg.train.device == "cuda";
  const char* grads_formula = zero == 0 ? "4N" : zero == 1 ? "4N + 4S" : "<= 2 buckets of 4N + 4S";
  const bool nvme_params = nvme && zero == 3 && cfg.parallel.offload_params;
  if (zero == 3) {
    text.pop_back();  // the parameters line ends here
    text += fmt::format(" [ZeRO-3: {}; Z = dp x cp = {}]\n",
                        nvme_params ? "the 4S of this rank's shares on NVMe; in memory two "
                                      "adjacent units (layers, the embedding) whole and the "
                                      "next share being read"
                        : cuda ? "4S in whole 2 MiB granules + two adjacent units (layers, the "
                                 "embedding) whole"
                               : "4S + two adjacent units (layers, the embedding) whole",
                        Z);
  }
  text += fmt::format("  gradients    {} [{}{}]\n", bytes_text(e.gradients), grads_formula,
                      zero ? fmt::format(", ZeRO-{}, {}", zero, share) : "");
  text +=
      fmt::format("  AdamW state  {} [{}]\n", bytes_text(e.optimizer),
                  nvme_params && cuda
                      ? "on NVMe with the parameter shares; in host memory 3 sub-groups of p, m "
                        "and v, updated there"
                  : nvme_params  ? "on NVMe; in memory 3 sub-groups of p, m and v"
                  : nvme && cuda ? "on NVMe; in host memory 3 sub-groups of m and v, updated there"
                  : nvme         ? "on NVMe; in memory 3 sub-groups of m and v"
                  : cuda && cfg.parallel.offload == "cpu"
                      ? fmt::format("in host memory: {}", zero ? "8S" : "8N")
                  : zero ? fmt::format("8S, {}", share)
                         : std::string("8N"));
  text +=
      fmt::format("  activations  {} ({})\n", bytes_text(e.activations), activations_text(cfg, e));
  if (e.snapshot > 0)
    text += fmt::format("  snapshot     {}{}\n", bytes_text(e.snapshot),
                        e.memory_level > 0 && cfg.train.device != "cuda"
                            ? fmt::format(" (the in-memory level's two copies {} of it)",
                                          bytes_text(e.memory_level))
                            : "");
  if (e.host > 0)
    text += fmt::format(
        "  host memory  {} (not in the device's total: {})\n", bytes_text(e.host),
        e.host > e.memory_level
            ? fmt::format(
                  "AdamW's offloaded state and page-locked staging{}{}",
                  nvme_params ? ", with 3 slots of the largest parameter share for its uploads"
                              : "",
                  e.memory_level > 0 ? ", and the in-memory checkpoint level's two copies" : "")
            : std::string("the in-memory checkpoint level's two copies of the state"));
  text += fmt::format("  total        {}", bytes_text(e.total()));
  return text;
}

NodeShare node_share() {
  NodeShare node;
  const double pages = double(sysconf(_SC_PHYS_PAGES)), page = double(sysconf(_SC_PAGE_SIZE));
  node.memory_bytes = pages * page;
  node.memory_source = "the machine's physical memory";
  // The job's cgroup (and those above it), not the root's: Slurm and Kubernetes set the
  // limit on the job's own cgroup.
  const CgroupMemory cgroup = cgroup_memory();
  if (cgroup.limit > 0 && double(cgroup.limit) < node.memory_bytes) {
    node.memory_bytes = double(cgroup.limit);
    node.memory_source = cgroup.source;
  }
  if (cgroup.high > 0) {
    node.memory_high = double(cgroup.high);
    node.memory_high_source = cgroup.high_source;
  }
  // Cores: the union of the ranks' affinity masks, so ranks bound to distinct cores count
  // each one and ranks started on one core count it once.
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  constexpr int kWords = CPU_SETSIZE / 64;
  std::vector<uint64_t> mask(kWords, 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) mask[size_t(cpu / 64)] |= uint64_t{1} << (cpu % 64);
  int threads = omp_get_max_threads();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &node.ranks);
    MPI_Comm_rank(local, &node.local_rank);
    MPI_Allreduce(MPI_IN_PLACE, mask.data(), kWords, MPI_UINT64_T, MPI_BOR, local);
    MPI_Allreduce(MPI_IN_PLACE, &threads, 1, MPI_INT, MPI_SUM, local);
    MPI_Comm_free(&local);
  }
  node.cores = 0;
  for (uint64_t word : mask) node.cores += std::popcount(word);
  node.cores = std::max(1, node.cores);
  node.threads = threads;
  if (const int devices = cuda_device_count(); devices > 0) {
    node.device_bytes = double(cuda_device_memory_bytes());
    node.device_ranks = 0;
    for (int r = 0; r < node.ranks; ++r)
      node.device_ranks += r % devices == node.local_rank % devices;
  }
  return node;
}

std::string resolve_recompute(Config& cfg, const parallel::MeshConfig& mesh,
                              const NodeShare& node) {
  if (!cfg.model.recompute.automatic) return "";
  cfg.model.recompute.on = false;
  const double without = estimate_memory(cfg, mesh).total();
  const auto [limit, limit_text] = memory_limit(cfg, node);
  // No limit known (CUDA without a device: start_rank refuses that run anyway): off. Every
  // rank decides alike, on where any needs it (machines may differ in memory), since
  // recompute repeats a layer's forward collectives in backward.
  int on = limit > 0 && without > limit;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Allreduce(MPI_IN_PLACE, &on, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  cfg.model.recompute.on = on != 0;
  if (!cfg.model.recompute.on)
    return fmt::format(
        "model.recompute = \"auto\": off, the plan fits without it ({} a rank{})",
        bytes_text(without),
        limit > 0 ? fmt::format(" within {}, {}", bytes_text(limit), limit_text) : "");
  return fmt::format(
      "model.recompute = \"auto\": on, the plan needs {} a rank without it, above {} ({}); "
      "with it {}",
      bytes_text(without), bytes_text(limit), limit_text,
      bytes_text(estimate_memory(cfg, mesh).total()));
}

namespace {

// The search for what would fit: the plan as it stands, the limit, and whether a changed
// recipe or mesh fits (or what it saves where it does not fit alone; estimate_memory
// refusing it: nothing).
struct FitSearch {
  const Config& cfg;
  const parallel::MeshConfig& mesh;
  double limit;
  MemoryEstimate e;

  bool fits(const Config& c) const {
    try {
      return estimate_memory(c, mesh).total() <= limit;
    } catch (const Error&) {  // a layout the changed value does not split into
      return false;
    }
  }
  double saves(const Config& c, const parallel::MeshConfig& layout) const {
    try {
      return e.total() - estimate_memory(c, layout).total();
    } catch (const Error&) {
      return 0.0;
    }
  }
};

// Smaller models and micro-batches: the largest value of each key that fits alone.
void model_knobs(const FitSearch& f, std::vector<std::string>& knobs) {
  const Config& cfg = f.cfg;
  const parallel::MeshConfig& mesh = f.mesh;
  auto fits = [&](const Config& c) { return f.fits(c); };
  const ModelConfig& m = cfg.model;
  const int64_t min_layers = int64_t(mesh.pp) * cfg.parallel.virtual_stages;
  const int64_t layers = largest_fitting(min_layers, m.n_layer - 1, [&](int64_t n) {
    Config c = cfg;
    c.model.n_layer = n;
    return fits(c);
  });
  if (layers >= min_layers) knobs.push_back(fmt::format("model.n_layer <= {}", layers));
  // Widths that keep the heads whole (and even for RoPE).
  const int64_t step = m.n_head * (m.family == ModelFamily::LLaMA ? 2 : 1);
  const int64_t widths = largest_fitting(1, m.d_model / step - 1, [&](int64_t k) {
    Config c = cfg;
    c.model.d_model = k * step;
    return fits(c);
  });
  if (widths >= 1) knobs.push_back(fmt::format("model.d_model <= {}", widths * step));
  const int64_t vocab = largest_fitting(2, m.vocab_size - 1, [&](int64_t v) {
    Config c = cfg;
    c.model.vocab_size = v;
    return fits(c);
  });
  if (vocab >= 2) knobs.push_back(fmt::format("model.vocab_size <= {}", vocab));
  const int64_t batch = largest_fitting(1, cfg.train.micro_batch - 1, [&](int64_t b) {
    Config c = cfg;
    c.train.micro_batch = b;
    return fits(c);
  });
  if (batch >= 1)
    knobs.push_back(
        fmt::format("train.micro_batch <= {} (raise train.grad_accum to keep the "
                    "batch)",
                    batch));
}

// Recomputation, and context parallelism dividing the activations of every layer by cp.
void activation_knobs(const FitSearch& f, std::vector<std::string>& knobs) {
  const Config& cfg = f.cfg;
  const parallel::MeshConfig& mesh = f.mesh;
  const ModelConfig& m = cfg.model;
  auto fits = [&](const Config& c) { return f.fits(c); };
  auto saves = [&](const Config& c, const parallel::MeshConfig& l) { return f.saves(c, l); };
  if (!m.recompute) {
    Config c = cfg;
    c.model.recompute = true;
    if (fits(c))
      knobs.push_back("model.recompute = true");
    else if (saves(c, mesh) > 0)
      knobs.push_back(fmt::format(
          "model.recompute = true (recomputes each layer's forward in backward: saves {} of "
          "activations, not enough alone)",
          bytes_text(saves(c, mesh))));
  }
  for (int cp = mesh.cp * 2; cp <= 64 && cfg.train.seq_len % (2 * cp) == 0; cp *= 2) {
    parallel::MeshConfig wider = mesh;
    wider.cp = cp;
    wider.cp_ulysses = mesh.cp_ulysses == mesh.cp && mesh.cp > 1 ? cp : mesh.cp_ulysses;
    bool fit = false;
    try {
      fit = estimate_memory(cfg, wider).total() <= f.limit;
    } catch (const Error&) {
    }
    if (fit) {
      knobs.push_back(fmt::format("parallel.cp = {} (now {}; {} ranks in all)", cp, mesh.cp,
                                  int64_t(cp) * mesh.dp * mesh.tp * mesh.pp));
      break;
    }
  }
}

// ZeRO and the offloads: the training state divided or moved out.
void state_knobs(const FitSearch& f, std::vector<std::string>& knobs) {
  const Config& cfg = f.cfg;
  const parallel::MeshConfig& mesh = f.mesh;
  const MemoryEstimate& e = f.e;
  const double limit = f.limit;
  auto fits = [&](const Config& c) { return f.fits(c); };
  auto saves = [&](const Config& c, const parallel::MeshConfig& l) { return f.saves(c, l); };
  // ZeRO divides the AdamW state (and at stage 2 the gradients) over dp x cp, the routed
  // experts' over edp.
  const bool zero_helps = cfg.parallel.zero < 2 && (cfg.parallel.pp == 1 || cfg.parallel.zero < 1);
  if (mesh.dp * mesh.cp > 1 && zero_helps) {
    Config c = cfg;
    c.parallel.zero = cfg.parallel.pp == 1 ? 2 : 1;
    const std::string what = fmt::format(
        "parallel.zero = {} (now {}; AdamW state{} over dp x cp = {}{})", c.parallel.zero,
        cfg.parallel.zero, c.parallel.zero == 2 ? " and gradients" : "", mesh.dp * mesh.cp,
        e.expert_values > 0 ? fmt::format(", the routed experts' over edp = {}",
                                          parallel::mesh_degree(mesh, parallel::Axis::EDP))
                            : "");
    if (fits(c))
      knobs.push_back(what);
    else if (saves(c, mesh) > 0)
      knobs.push_back(
          fmt::format("{}: saves {}, not enough alone", what, bytes_text(saves(c, mesh))));
  }
  // One data-parallel rank has no one to share its state with: ZeRO over more of them.
  if (mesh.dp * mesh.cp == 1 && zero_helps && e.optimizer > 0) {
    Config c = cfg;
    c.parallel.zero = cfg.parallel.pp == 1 ? 2 : 1;
    for (int dp = 2; dp <= 64; dp *= 2) {
      parallel::MeshConfig wider = mesh;
      wider.dp = dp;
      if (saves(c, wider) <= 0 || e.total() - saves(c, wider) > limit) continue;
      knobs.push_back(fmt::format(
          "parallel.zero = {} over {} data-parallel ranks (now 1; {} ranks in all): AdamW "
          "state{} divided over them",
          c.parallel.zero, dp, int64_t(dp) * mesh.tp * mesh.pp * mesh.cp,
          c.parallel.zero == 2 ? " and gradients" : ""));
      break;
    }
  }
  // NVMe offload leaves three sub-groups of AdamW's state in memory.
  if (cfg.parallel.offload != "nvme" && cfg.train.device == "cpu") {
    Config c = cfg;
    c.parallel.offload = "nvme";
    if (fits(c))
      knobs.push_back(
          "parallel.offload = \"nvme\" with parallel.offload_path = a directory on a fast drive "
          "(AdamW state on disk, streamed through three sub-groups in memory)");
  }
  // On CUDA AdamW's state can live in host memory instead (optim/host_offload.h).
  if (cfg.parallel.offload == "none" && cfg.train.device == "cuda") {
    Config c = cfg;
    c.parallel.offload = "cpu";
    if (fits(c))
      knobs.push_back("parallel.offload = \"cpu\" (AdamW state in host memory, updated there)");
  }
}

// More ranks in tp x pp, and the experts over more of ep.
void spread_knobs(const FitSearch& f, std::vector<std::string>& knobs) {
  const parallel::MeshConfig& mesh = f.mesh;
  const MemoryEstimate& e = f.e;
  const ModelConfig& m = f.cfg.model;
  const double limit = f.limit;
  // Parameters, gradients and AdamW state divide over tp x pp; activations mostly do not.
  const double state = e.parameters + e.gradients + e.optimizer;
  const double room = limit - e.activations;
  const std::string spread =
      room > 0 ? fmt::format("about {:.0f}x more ranks in parallel.tp x parallel.pp",
                             std::ceil(state / room))
               : std::string("more ranks in parallel.tp x parallel.pp");
  knobs.push_back(fmt::format("{} (now tp {} x pp {})", spread, mesh.tp, mesh.pp));
  // The routed experts' state divides over ep (and etp) alone.
  if (e.expert_values > 0 && m.n_experts / mesh.ep > 1)
    knobs.push_back(fmt::format(
        "spread the experts ({} of the values) over more ranks: parallel.ep up to {} (now {})",
        bytes_text(e.expert_values * 4), m.n_experts, mesh.ep));
}

// The plan's items, largest first.
std::string largest_items(const Config& cfg, const MemoryEstimate& e) {
  struct Item {
    std::string text;
    double bytes;
  };
  std::vector<Item> items = {
      {fmt::format("parameters {} ({})", bytes_text(e.parameters), values_text(e)), e.parameters},
      {fmt::format("gradients {}", bytes_text(e.gradients)), e.gradients},
      {fmt::format("AdamW state {}", bytes_text(e.optimizer)), e.optimizer},
      {fmt::format("activations {} ({})", bytes_text(e.activations), activations_text(cfg, e)),
       e.activations}};
  // Only where there is one (saves on), and the note about host memory only on CUDA.
  if (e.snapshot > 0)
    items.push_back({fmt::format("checkpoint snapshot {} ({}{}train.save_every = 0 drops it)",
                                 bytes_text(e.snapshot),
                                 cfg.train.device == "cuda"
                                     ? "checkpoint.snapshot = \"copy\" keeps it in host memory; "
                                     : "",
                                 e.memory_level > 0 && cfg.train.device != "cuda"
                                     ? "two thirds of it the in-memory level's, which "
                                       "checkpoint.memory_every = 0 drops; "
                                     : ""),
                     e.snapshot});
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  std::string largest;
  for (const Item& item : items) largest += (largest.empty() ? "" : ", ") + item.text;
  return largest;
}

}  // namespace

void check_memory(const Config& cfg, const parallel::MeshConfig& mesh, const NodeShare& node) {
  if (cfg.train.memory_limit_mb == 0 && cfg.train.device != "cpu") return;
  const auto [limit, limit_text] = memory_limit(cfg, node);  // bytes, how they were chosen
  const MemoryEstimate e = estimate_memory(cfg, mesh);
  if (e.total() <= limit) {
    report_fit(cfg, node, e);
    return;
  }
  const FitSearch search{cfg, mesh, limit, e};
  std::vector<std::string> knobs;
  model_knobs(search, knobs);
  activation_knobs(search, knobs);
  state_knobs(search, knobs);
  spread_knobs(search, knobs);
  std::string options;
  for (const std::string& k : knobs) options += (options.empty() ? "" : "; or ") + k;
  fail(
      "{}: the memory plan does not fit: each rank{} needs about {} ({}), above {}. "
      "To fit: {}; or {} train.memory_limit_mb (MiB per rank)",
      cfg.recipe_path, mesh.pp > 1 ? fmt::format(" of pipeline stage {}", e.stage) : "",
      bytes_text(e.total()), largest_items(cfg, e), limit_text, options,
      cfg.train.memory_limit_mb > 0 ? "raise" : "set");
}

}  // namespace pentad
