#include "train/memory_budget.h"

#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "model/moe.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/pipeline.h"
#include "train/trainer.h"

namespace pentad {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// format_bytes for sizes past what a size_t holds.
std::string bytes_text(double bytes) {
  if (bytes < 1e18) return format_bytes(size_t(bytes));
  return fmt::format("{:.4g} EiB", bytes / (kMiB * kMiB * kMiB));
}

// Doubles throughout: a recipe may ask for 10^12-wide layers, and the product must not wrap.
double ffn_width(const ModelConfig& m) {
  const double C = double(m.d_model);
  if (m.d_ff > 0) return double(m.d_ff);
  if (m.family == ModelFamily::GPT2) return 4 * C;
  return std::ceil(std::floor(8 * C / 3) / 256) * 256;  // ffn_dim's LLaMA rule
}

std::vector<parallel::pp::Chunk> chunks_of_stage(const Config& cfg, int stages, int stage) {
  const ParallelConfig& p = cfg.parallel;
  if (stages == 1 && p.virtual_stages == 1 && p.pp_layout.empty())
    return {parallel::pp::Chunk{0, cfg.model.n_layer, true, true}};
  return parallel::pp::stage_chunks(
      parallel::pp::chunk_layers(cfg.model.n_layer, stages, int(p.virtual_stages), p.pp_layout),
      stages, stage);
}

// The MoE layers among [begin, end).
double moe_layers_in(const std::vector<int64_t>& moe, int64_t begin, int64_t end) {
  return double(
      std::count_if(moe.begin(), moe.end(), [&](int64_t l) { return begin <= l && l < end; }));
}

// One stage's bytes. Shapes as in Model::build_params, plan_layer, plan_slot and
// plan_shared, on one tp rank: column- and row-parallel matrices split over tp, norms whole.
// An MoE layer (model/moe.h) holds, in place of the MLP, the router, n_experts / ep routed
// experts split over etp and the shared experts as one MLP split over tp.
MemoryEstimate estimate_stage(const Config& cfg, const parallel::MeshConfig& mesh, int stage) {
  const ModelConfig& m = cfg.model;
  const bool gpt2 = m.family == ModelFamily::GPT2, sp = cfg.parallel.sequence_parallel;
  const double p = mesh.tp, C = double(m.d_model), V = double(m.vocab_size), F = ffn_width(m);
  const double Ckv = double(m.kv_heads()) * double(m.head_dim());
  // Under context parallelism a rank holds seq_len / cp tokens of each sequence.
  const double b = double(cfg.train.micro_batch), t = double(cfg.train.seq_len) / mesh.cp;
  const double N = b * t, Nl = sp ? N / p : N;  // rows: whole, and this rank's
  const double act = cfg.train.precision == "bf16" ? 2 : 4, f32 = 4;
  const double mlp_mats = gpt2 ? 2 : 3;  // up, down (+ gate)

  // An MLP of width W split over q ranks: matrices, and GPT-2's up bias (split) and down
  // bias (whole).
  auto mlp_values = [&](double W, double q) {
    return mlp_mats * W * C / q + (gpt2 ? W / q + C : 0);
  };
  const double attn_values =
      (2 * C * C + 2 * Ckv * C) / p + (gpt2 ? 5 * C + (C + 2 * Ckv) / p : 2 * C);  // + norms
  const double layer_values = attn_values + mlp_values(F, p);
  const double attn_acts = act * (2 * N * C + Nl * C + 2 * N * (C / p) + 2 * N * (Ckv / p)) +
                           f32 * ((gpt2 ? 4 : 2) * Nl + b * t * double(m.n_head) / p);
  const double layer_acts = attn_acts + act * mlp_mats * N * (F / p);

  // MoE layers: E experts, k picks, width Fe (each etp rank 1/etp of it), shared width Fs.
  const std::vector<int64_t> moe = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  const double E = double(m.n_experts), k = double(m.top_k), ep = mesh.ep, etp = mesh.etp;
  const double Fe = m.is_moe() ? double(expert_ffn_dim(m)) : 0;
  const double Fs = double(m.n_shared_experts) * Fe;
  const double expert_values = E / ep * mlp_values(Fe, etp);
  const double moe_values = attn_values + E * C + E + expert_values +  // router, expert bias
                            (Fs > 0 ? mlp_values(Fs, p) : 0);
  // Dispatch (MoeBlock::Acts: rows in the activations' type, routing in fp32), worst case:
  // each of the ep x etp ranks that send to
  // this one routes all its Nl rows here, each to min(k, E / ep) of its local experts; with
  // a capacity, a local expert takes at most min(Nl, capacity) rows from each of them.
  // Sent: A = Nl k permuted rows and their outputs; received: R rows in and out and their
  // activations; the router's logits, scores, picks, weights and positions.
  const double A = Nl * k, senders = ep * etp;
  double R = senders * Nl * std::min(k, E / ep);
  if (m.moe.capacity_factor > 0) {
    const double capacity = std::ceil(double(m.moe.capacity_factor) * N * k / E);
    R = std::min(R, E / ep * senders * std::min(Nl, capacity));
  }
  const double dispatch = act * (2 * A * C + 2 * R * C + mlp_mats * R * (Fe / etp)) +
                          f32 * (2 * Nl * E + 3 * Nl * k + A);
  // Backward's scratch: the gradients of those rows, and three of width Fe/etp for all of
  // them (the grouped expert GEMMs' d(act), d(gate), d(up)); in bf16 also the router's fp32
  // input and gradient and that gradient cast back (Nl, C) each.
  const double dispatch_backward = act * (2 * A * C + 2 * R * C + 3 * R * (Fe / etp)) +
                                   f32 * Nl * k + (act < f32 ? (2 * f32 + act) * Nl * C : 0);
  const double moe_acts = attn_acts + (Fs > 0 ? act * mlp_mats * N * (Fs / p) : 0) + dispatch;

  const double head_acts =
      act * (N * C + (sp ? Nl * C : 0) + N * V / p) + f32 * ((gpt2 ? 2 : 1) * Nl + N);

  MemoryEstimate e;
  e.stage = stage;
  const std::vector<parallel::pp::Chunk> chunks = chunks_of_stage(cfg, mesh.pp, stage);
  std::vector<parallel::pp::Action> actions;
  if (mesh.pp > 1) actions = parallel::pp::stage_actions(schedule_spec(cfg), stage);
  bool holds_last = false, holds_moe = false, holds_dense = false;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const parallel::pp::Chunk& chunk = chunks[c];
    const double layers = double(chunk.layer_end - chunk.layer_begin);
    const double moe_layers = moe_layers_in(moe, chunk.layer_begin, chunk.layer_end);
    holds_moe = holds_moe || moe_layers > 0;
    holds_dense = holds_dense || moe_layers < layers;
    e.values += (layers - moe_layers) * layer_values + moe_layers * moe_values;
    e.expert_values += moe_layers * expert_values;
    if (chunk.first) e.values += V * C / p + (gpt2 ? double(m.max_seq_len) * C : 0);
    if (chunk.last) {
      holds_last = true;
      e.values += gpt2 ? 2 * C : C;
      // A tied head is the embedding itself on one stage, a copy of it on the last stage.
      if (!m.tie_embeddings || mesh.pp > 1) e.values += V * C / p;
    }
    // One activation slot per micro-batch the schedule keeps in flight on this chunk.
    double in_flight = 1;
    if (!actions.empty()) {
      std::vector<parallel::pp::Action> mine;
      for (const parallel::pp::Action& a : actions)
        if (a.chunk == int(c)) mine.push_back(a);
      in_flight = std::max(1, parallel::pp::peak_in_flight(mine));
    }
    // The dispatch buffers stay per micro-batch even under recompute (MoeBlock::Acts).
    const double kept =
        (m.recompute ? 0
                     : (layers - moe_layers) * layer_acts + moe_layers * (moe_acts - dispatch)) +
        moe_layers * dispatch;
    const double slot = 8 * N + (layers + 1) * Nl * C * act + kept + (chunk.last ? head_acts : 0);
    e.activations += in_flight * slot;
    e.dispatch += in_flight * moe_layers * dispatch;
  }
  // Scratch shared by every layer: backward's gradients, the projection output, and the
  // recomputed layer's activations, with the MLP widths of the layers held here; an MoE
  // model adds the routed output, and an MoE layer's backward the gradients of its
  // dispatched rows.
  const double widest = std::max(holds_dense ? F : 0, holds_moe ? Fs : 0) / p;
  e.activations += act * (N * C + Nl * C + (sp ? N * C : 0) + N * C + (sp ? 2 * Nl * C : 0) +
                          2 * N * (C / p) + 2 * N * (Ckv / p) + mlp_mats * N * widest) +
                   (m.recompute ? attn_acts + act * mlp_mats * N * widest : 0) +
                   (m.is_moe() ? act * Nl * C : 0) + (p > 1 && holds_last ? 3 * f32 * N : 0);
  // Context parallelism's scratch (parallel/cp/context_parallel.cpp), shared by the layers:
  // Ulysses' exchange buffers and head-sharded q, k, v, out and gradients; the ring's two
  // K/V blocks, three dK/dV partials and one block's output.
  if (mesh.cp > 1) {
    const double U = mesh.cp_ulysses, R = mesh.cp / U, D = double(m.head_dim());
    const double kv_heads = std::max(1.0, double(m.kv_heads()) / p / U), slice = N * U;
    const double replica = U * p > double(m.kv_heads()) ? N * double(m.kv_heads()) / p * D : 0;
    if (U > 1)
      e.activations += act * (2 * N * std::max(C / p, U * kv_heads * D) + 4 * N * (C / p) +
                              4 * slice * kv_heads * D + replica);
    if (R > 1)
      e.activations += act * (10 * slice * kv_heads * D + N * (C / p)) + f32 * N * m.n_head / p;
  }
  if (holds_moe) {
    // The dispatcher's staging (parallel/ep/expert_parallel.h), one for every layer: this
    // etp rank's share of the received rows (R / etp), and with etp > 1 every etp rank's, in
    // the rows' type.
    const double staging = senders > 1 ? act * C * (R / etp + (etp > 1 ? R : 0)) : 0;
    e.activations += dispatch_backward + staging;
    e.dispatch += dispatch_backward + staging;
  }
  e.parameters = e.values * (f32 + (cfg.train.precision == "bf16" ? 2 : 0));
  // ZeRO over the Z = dp x cp ranks (the routed experts over their edp replicas): AdamW's m
  // and v for this rank's shares S, 1/Z of the dense values and 1/edp of the experts'; stage 1
  // adds the reduced S to the full gradients, stage 2 keeps the full gradients only while
  // backward fills a bucket (two at most in flight) besides the reduced S and a second S for
  // the next micro-batch's reduction.
  const int64_t zero = mesh.dp * mesh.cp > 1 ? cfg.parallel.zero : 0;
  const double Z = zero > 0 ? double(mesh.dp * mesh.cp) : 1.0;
  const double edp = zero > 0 ? double(parallel::mesh_degree(mesh, parallel::Axis::EDP)) : 1.0;
  const double shares = (e.values - e.expert_values) / Z + e.expert_values / edp;
  // A bucket never splits a parameter, so the embedding (or an untied head, V C / p) may
  // make one larger than bucket_mb; at stage 3 a bucket is a unit: a layer or the embedding
  // (zero >= 2 runs without pp, so this stage holds both). The experts' reducer keeps its
  // own buckets in flight.
  const double embedding = V * C / p + (gpt2 ? double(m.max_seq_len) * C : 0);
  const double unit = std::max(layer_values, embedding) * f32;
  const double bucket_mb = double(cfg.parallel.bucket_mb) * kMiB;
  const double bucket = zero == 3 ? unit : std::max(bucket_mb, V * C / p * f32);
  const double dense_values = e.values - e.expert_values;
  const double expert_bucket = zero == 3 ? expert_values * f32 : bucket_mb;  // a layer's experts
  e.gradients = zero == 0 ? e.values * f32
                : zero == 1
                    ? (e.values + shares) * f32
                    : std::min(dense_values * f32, 2 * bucket) +
                          std::min(e.expert_values * f32, 2 * expert_bucket) + 2 * shares * f32;
  const double moments = 2 * shares * f32;  // AdamW's m and v of this rank's shares
  e.optimizer = moments;
  const bool nvme = cfg.parallel.offload == "nvme";
  const bool nvme_params = nvme && zero == 3 && cfg.parallel.offload_params;
  // ZeRO-3's unit with MoE: a layer's dense parameters and its routed experts, each gathered
  // by its own reducer.
  const double unit3 = std::max({layer_values, holds_moe ? moe_values : 0.0, embedding}) * f32;
  if (zero == 3)  // this rank's shares, and two units whole (one in use, one fetched); with
    // the shares on NVMe (ZeRO-Infinity) none of them, but a third unit's on its way
    e.parameters = (nvme_params ? unit3 / Z : e.parameters * shares / e.values) +
                   std::min(e.parameters, 2 * unit3);
  if (nvme) {  // on disk; in memory three sub-groups of m and v (and the parameter shares)
    const double tensors = nvme_params ? 3 : 2;
    e.optimizer = 3 * std::min(tensors * shares * f32,
                               tensors * double(cfg.parallel.nvme_subgroup_kb) * 1024);
  }
  if (cfg.train.save_every > 0)  // values, m and v again (offloaded too: read into staging)
    e.snapshot = (zero == 3 ? shares : e.values) * f32 + moments;
  // CUDA: dropping a bucket or unit zeroes device memory without giving it back
  // (Arena::discard), so the arenas count whole; AdamW on the host holds none of it.
  if (cfg.train.device == "cuda") {
    if (zero >= 2) e.gradients = (e.values + 2 * shares) * f32;
    if (zero == 3) e.parameters = e.values * (f32 + (cfg.train.precision == "bf16" ? 2 : 0));
    // Both offloads update on the host (the "nvme" sub-groups and staging are host memory).
    if (cfg.parallel.offload != "none") e.optimizer = 0;
  }
  return e;
}

std::string values_text(const MemoryEstimate& e) {
  if (e.expert_values == 0) return fmt::format("{:.4g} values", e.values);
  return fmt::format("{:.4g} values, {:.4g} of them in routed experts", e.values, e.expert_values);
}

std::string activations_text(const Config& cfg, const MemoryEstimate& e) {
  return fmt::format(
      "micro-batch {} x {}{}, recompute {}{}", cfg.train.micro_batch, cfg.train.seq_len,
      cfg.parallel.cp > 1 ? fmt::format(" split over cp {}", cfg.parallel.cp) : "",
      cfg.model.recompute ? "on" : "off",
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
  const double share = node.memory_bytes / std::max(1, node.ranks);
  return {share, fmt::format("this rank's share of the machine's memory ({} / {} rank{} = {}; "
                             "train.memory_limit_mb = 0 means automatic)",
                             bytes_text(node.memory_bytes), node.ranks,
                             node.ranks == 1 ? "" : "s on it", bytes_text(share))};
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

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh) {
  MemoryEstimate worst;
  for (int stage = 0; stage < mesh.pp; ++stage) {
    const MemoryEstimate e = estimate_stage(cfg, mesh, stage);
    if (stage == 0 || e.total() > worst.total()) worst = e;
  }
  return worst;
}

std::string describe_memory(const Config& cfg, const parallel::MeshConfig& mesh) {
  const MemoryEstimate e = estimate_memory(cfg, mesh);
  const ModelConfig& m = cfg.model;
  std::string text = fmt::format(
      "memory plan (estimate for the rank that needs the most{}; tp {} cp {} dp {} pp {} ep {} "
      "etp {}, {} {}):\n",
      mesh.pp > 1 ? fmt::format(": pipeline stage {}", e.stage) : "", mesh.tp, mesh.cp, mesh.dp,
      mesh.pp, mesh.ep, mesh.etp, cfg.train.device, cfg.train.precision);
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
  const char* grads_formula =
      zero == 0           ? "4N"
      : zero == 1 || cuda ? (zero == 1 ? "4N + 4S" : "4N + 8S: on CUDA the arena stays whole")
                          : "<= 2 buckets of 4N + 8S";
  const bool nvme_params = nvme && zero == 3 && cfg.parallel.offload_params;
  if (zero == 3 && !cuda) {
    text.pop_back();  // the parameters line ends here
    text +=
        fmt::format(" [ZeRO-3: {}two units (a layer or the embedding) whole; Z = dp x cp = {}]\n",
                    nvme_params ? "the 4S of this rank's shares on NVMe; in memory a unit's "
                                  "share being read and "
                                : "4S + ",
                    Z);
  }
  text += fmt::format("  gradients    {} [{}{}]\n", bytes_text(e.gradients), grads_formula,
                      zero ? fmt::format(", ZeRO-{}, {}", zero, share) : "");
  text +=
      fmt::format("  AdamW state  {} [{}]\n", bytes_text(e.optimizer),
                  nvme_params    ? "on NVMe; in memory 3 sub-groups of p, m and v"
                  : nvme && cuda ? "on NVMe; in host memory 3 sub-groups of m and v, updated there"
                  : nvme         ? "on NVMe; in memory 3 sub-groups of m and v"
                  : cuda && cfg.parallel.offload == "cpu"
                      ? fmt::format("in host memory: {}", zero ? "8S" : "8N")
                  : zero ? fmt::format("8S, {}", share)
                         : std::string("8N"));
  text +=
      fmt::format("  activations  {} ({})\n", bytes_text(e.activations), activations_text(cfg, e));
  if (e.snapshot > 0) text += fmt::format("  snapshot     {}\n", bytes_text(e.snapshot));
  text += fmt::format("  total        {}", bytes_text(e.total()));
  return text;
}

MemoryEstimate estimate_memory(const Config& cfg, const parallel::MeshConfig& mesh, int stage) {
  return estimate_stage(cfg, mesh, stage);
}

NodeShare node_share() {
  NodeShare node;
  const double pages = double(sysconf(_SC_PHYS_PAGES)), page = double(sysconf(_SC_PAGE_SIZE));
  node.memory_bytes = pages * page;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    double limit = 0;
    if (file >> limit && limit > 0) node.memory_bytes = std::min(node.memory_bytes, limit);
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
    MPI_Allreduce(MPI_IN_PLACE, mask.data(), kWords, MPI_UINT64_T, MPI_BOR, local);
    MPI_Allreduce(MPI_IN_PLACE, &threads, 1, MPI_INT, MPI_SUM, local);
    MPI_Comm_free(&local);
  }
  node.cores = 0;
  for (uint64_t word : mask) node.cores += std::popcount(word);
  node.cores = std::max(1, node.cores);
  node.threads = threads;
  return node;
}

void check_memory(const Config& cfg, const parallel::MeshConfig& mesh, const NodeShare& node) {
  if (cfg.train.memory_limit_mb == 0 && cfg.train.device != "cpu") return;
  const auto limits = memory_limit(cfg, node);  // (bytes, how they were chosen)
  const auto& [limit, limit_text] = limits;
  const MemoryEstimate e = estimate_memory(cfg, mesh);
  if (e.total() <= limit) return;

  auto fits = [&](Config c) {
    try {
      return estimate_memory(c, mesh).total() <= limits.first;
    } catch (const Error&) {  // a layout the changed value does not split into
      return false;
    }
  };
  std::vector<std::string> knobs;
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
  if (!m.recompute) {
    Config c = cfg;
    c.model.recompute = true;
    if (fits(c)) knobs.push_back("model.recompute = true");
  }
  // Context parallelism divides the activations of every layer by cp.
  for (int cp = mesh.cp * 2; cp <= 64 && cfg.train.seq_len % (2 * cp) == 0; cp *= 2) {
    parallel::MeshConfig wider = mesh;
    wider.cp = cp;
    wider.cp_ulysses = mesh.cp_ulysses == mesh.cp && mesh.cp > 1 ? cp : mesh.cp_ulysses;
    bool fit = false;
    try {
      fit = estimate_memory(cfg, wider).total() <= limits.first;
    } catch (const Error&) {
    }
    if (fit) {
      knobs.push_back(fmt::format("parallel.cp = {} (now {}; {} ranks in all)", cp, mesh.cp,
                                  int64_t(cp) * mesh.dp * mesh.tp * mesh.pp));
      break;
    }
  }
  // ZeRO divides the AdamW state (and at stage 2 the gradients) over dp x cp, the routed
  // experts' over edp.
  if (mesh.dp * mesh.cp > 1 && cfg.parallel.zero < 2 &&
      (cfg.parallel.pp == 1 || cfg.parallel.zero < 1)) {
    Config c = cfg;
    c.parallel.zero = cfg.parallel.pp == 1 ? 2 : 1;
    if (fits(c))
      knobs.push_back(fmt::format(
          "parallel.zero = {} (now {}; AdamW state{} over dp x cp = {}{})", c.parallel.zero,
          cfg.parallel.zero, c.parallel.zero == 2 ? " and gradients" : "", mesh.dp * mesh.cp,
          e.expert_values > 0 ? fmt::format(", the routed experts' over edp = {}",
                                            parallel::mesh_degree(mesh, parallel::Axis::EDP))
                              : ""));
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

  struct Item {
    std::string text;
    double bytes;
  };
  std::vector<Item> items = {
      {fmt::format("parameters {} ({})", bytes_text(e.parameters), values_text(e)), e.parameters},
      {fmt::format("gradients {}", bytes_text(e.gradients)), e.gradients},
      {fmt::format("AdamW state {}", bytes_text(e.optimizer)), e.optimizer},
      {fmt::format("checkpoint snapshot {} (checkpoint.snapshot = \"copy\" keeps it in host "
                   "memory on CUDA; train.save_every = 0 drops it)",
                   bytes_text(e.snapshot)),
       e.snapshot},
      {fmt::format("activations {} ({})", bytes_text(e.activations), activations_text(cfg, e)),
       e.activations}};
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  std::string largest;
  for (const Item& item : items) largest += (largest.empty() ? "" : ", ") + item.text;
  std::string options;
  for (const std::string& k : knobs) options += (options.empty() ? "" : "; or ") + k;
  fail(
      "{}: the memory plan does not fit: each rank{} needs about {} ({}), above {}. "
      "To fit: {}; or {} train.memory_limit_mb (MiB per rank)",
      cfg.recipe_path, mesh.pp > 1 ? fmt::format(" of pipeline stage {}", e.stage) : "",
      bytes_text(e.total()), largest, limit_text, options,
      cfg.train.memory_limit_mb > 0 ? "raise" : "set");
}

}  // namespace pentad
