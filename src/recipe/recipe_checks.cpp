#include "recipe/recipe_checks.h"

#include <fmt/format.h>

#include "core/check.h"
#include "model/moe.h"
#include "recipe/recipe_keys.h"

namespace pentad::recipe {
namespace {

std::string divisors_of(int64_t n) {
  std::string list;
  for (int64_t d = 1; d <= n && list.size() < 60; ++d)
    if (n % d == 0) list += fmt::format("{}{}", list.empty() ? "" : ", ", d);
  return list;
}

// Context parallelism (parallel/cp/context_parallel.h): the form, its degrees, and what
// the sequence and the heads must divide into.
template <typename Where>
void check_context(const Config& c, const Where& where) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  const bool hybrid = p.cp_impl == "hybrid";
  if (!hybrid && p.cp_ulysses != 0)
    fail(
        "{}: parallel.cp_ulysses = {} is the Ulysses degree of parallel.cp_impl = \"hybrid\", "
        "but cp_impl is \"{}\": set cp_impl = \"hybrid\" or remove cp_ulysses",
        where({"parallel.cp_ulysses"}), p.cp_ulysses, p.cp_impl);
  if (p.cp == 1) return;
  if (hybrid && (p.cp_ulysses < 2 || p.cp_ulysses >= p.cp || p.cp % p.cp_ulysses != 0))
    fail(
        "{}: parallel.cp_ulysses = {} must divide parallel.cp = {} and lie strictly between 1 "
        "and cp (Ulysses over cp_ulysses ranks, a ring over cp / cp_ulysses): choose one of {} "
        "without 1 and {}, or set cp_impl = \"ulysses\" or \"ring\"",
        where({"parallel.cp_ulysses", "parallel.cp", "parallel.cp_impl"}), p.cp_ulysses, p.cp,
        divisors_of(p.cp), p.cp);
  const int64_t ulysses = p.cp_impl == "ulysses" ? p.cp : hybrid ? p.cp_ulysses : 1;
  const int64_t T = c.train.seq_len;
  if (ulysses < p.cp && T % (2 * p.cp) != 0)
    fail(
        "{}: train.seq_len = {} must be a multiple of 2 x parallel.cp = {}: the ring's zig-zag "
        "layout cuts each sequence into 2 x cp chunks; change train.seq_len (e.g. {}) or "
        "parallel.cp",
        where({"train.seq_len", "parallel.cp"}), T, 2 * p.cp,
        (T + 2 * p.cp - 1) / (2 * p.cp) * (2 * p.cp));
  if (ulysses == 1) return;
  const int64_t heads = m.n_head / p.tp, kv = m.kv_heads() / p.tp;
  if (heads % ulysses != 0)
    fail(
        "{}: the Ulysses degree {} does not divide the {} query heads of a tp rank "
        "(model.n_head = {} / parallel.tp = {}): change {} or model.n_head",
        where({"parallel.cp", "parallel.cp_ulysses", "model.n_head"}), ulysses, heads, m.n_head,
        p.tp, hybrid ? "parallel.cp_ulysses" : "parallel.cp");
  if (kv % ulysses != 0 && ulysses % kv != 0)
    fail(
        "{}: the Ulysses degree {} and the {} kv heads of a tp rank (model.n_kv_head = {} / "
        "parallel.tp = {}) must divide one another (fewer kv heads are replicated, more are "
        "split): change {} or model.n_kv_head",
        where({"parallel.cp", "parallel.cp_ulysses", "model.n_kv_head"}), ulysses, kv, m.kv_heads(),
        p.tp, hybrid ? "parallel.cp_ulysses" : "parallel.cp");
}

// Mixture of Experts (model/moe.h) against the rest of the recipe. where(keys): the origin
// of the first of `keys` the recipe set.
template <typename Where>
void check_moe(const Config& c, const Where& where) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  if (m.n_experts > 0 && m.moe_layers.empty())
    fail(
        "{}: model.n_experts = {} but model.moe_layers is empty: name the MoE layers (\"all\", "
        "\"every:2\", \"from:1\" or a list such as \"1,3\"), or set model.n_experts = 0 for a "
        "dense model",
        where({"model.moe_layers", "model.n_experts"}), m.n_experts);
  if (m.n_experts == 0 && !m.moe_layers.empty())
    fail(
        "{}: model.moe_layers = {} but model.n_experts = 0: set model.n_experts (e.g. 8), or "
        "model.moe_layers = \"\" for a dense model",
        where({"model.n_experts", "model.moe_layers"}), quote(m.moe_layers));
  if (!m.is_moe()) {
    if (m.n_shared_experts > 0 || m.d_ff_expert > 0)
      fail(
          "{}: model.{} is set but the model has no MoE layers: set model.n_experts and "
          "model.moe_layers, or leave it 0",
          where({"model.n_shared_experts", "model.d_ff_expert"}),
          m.n_shared_experts > 0 ? "n_shared_experts" : "d_ff_expert");
    if (p.ep > 1 || p.etp > 1)
      fail(
          "{}: parallel.ep = {} and parallel.etp = {} split experts, but the model has no MoE "
          "layers: set both to 1, or give the model experts (model.n_experts, model.moe_layers)",
          where({"parallel.ep", "parallel.etp"}), p.ep, p.etp);
    return;
  }
  std::vector<int64_t> layers;
  try {
    layers = moe_layer_indices(m);
  } catch (const Error& e) {
    fail("{}: {}", where({"model.moe_layers", "model.n_layer"}), e.what());
  }
  if (layers.empty())
    fail("{}: model.moe_layers = {} names no layer of the {} (layers 0 to {})",
         where({"model.moe_layers", "model.n_layer"}), quote(m.moe_layers), m.n_layer,
         m.n_layer - 1);
  if (m.top_k > m.n_experts)
    fail("{}: model.top_k ({}) must be at most model.n_experts ({})",
         where({"model.top_k", "model.n_experts"}), m.top_k, m.n_experts);
  const float capacity = m.moe.capacity_factor;
  if (capacity > 0 && double(capacity) * double(m.top_k) < 1.0)
    fail(
        "{}: moe.capacity_factor = {} is below 1 / model.top_k = 1 / {}: the experts together "
        "would keep fewer picks than a micro-batch has tokens, so even perfectly balanced "
        "routing drops tokens whole; use at least {:.4g} (1 or more keeps balanced routing "
        "whole), or 0 for dropless",
        where({"moe.capacity_factor", "model.top_k"}), format_float(capacity), m.top_k,
        1.0 / double(m.top_k));
  if (m.n_experts % p.ep != 0)
    fail(
        "{}: model.n_experts ({}) must be divisible by parallel.ep ({}): each expert-parallel "
        "rank holds n_experts / ep whole experts; change parallel.ep to a divisor of {} ({})",
        where({"parallel.ep", "model.n_experts"}), m.n_experts, p.ep, m.n_experts,
        divisors_of(m.n_experts));
  const int64_t width = expert_ffn_dim(m);
  if (width % p.etp != 0)
    fail(
        "{}: the expert width ({} = {}) must be divisible by parallel.etp ({}): change "
        "parallel.etp to a divisor of {} ({})",
        where({"parallel.etp", "model.d_ff_expert"}),
        m.d_ff_expert > 0 ? "model.d_ff_expert" : "model.d_ff_expert = 0: the ffn width", width,
        p.etp, width, divisors_of(width));
  const int64_t shared = m.n_shared_experts * width;
  if (shared % p.tp != 0)
    fail(
        "{}: the shared experts' width (model.n_shared_experts x expert width = {} x {} = {}) "
        "must be divisible by parallel.tp ({}): they run as one tensor-parallel MLP; change "
        "parallel.tp to a divisor of {}",
        where({"parallel.tp", "model.n_shared_experts"}), m.n_shared_experts, width, shared, p.tp,
        shared);
  if (p.tp > 1 && !p.sequence_parallel)
    fail(
        "{}: MoE layers with parallel.tp = {} need parallel.sequence_parallel = true: every rank "
        "must route distinct tokens (as in Megatron), not tp copies of the same ones",
        where({"parallel.tp", "parallel.sequence_parallel"}), p.tp);
}

// ZeRO (parallel.zero) and offload: what each composes with so far.
template <typename Where>
void check_zero(const Config& c, const Where& where) {
  const ParallelConfig& p = c.parallel;
  if (p.offload == "nvme" && p.offload_path.empty())
    fail(
        "{}: parallel.offload = \"nvme\" needs parallel.offload_path, a directory on the drive "
        "that holds AdamW's state",
        where({"parallel.offload", "parallel.offload_path"}));
  if (p.offload != "nvme" && !p.offload_path.empty())
    fail(
        "{}: parallel.offload_path is set but parallel.offload = \"{}\": set offload = \"nvme\" "
        "or remove offload_path",
        where({"parallel.offload_path", "parallel.offload"}), p.offload);
  // Saves of NVMe-offloaded state read the file into the copy snapshot's staging buffer
  // (train/checkpoint_nvme.cpp); a swap snapshot would need a second file.
  if (p.offload == "nvme" && c.train.save_every > 0 && c.checkpoint.snapshot == "swap")
    fail(
        "{}: checkpoint.snapshot = \"swap\" keeps a second set of the state in memory, and "
        "NVMe-offloaded AdamW state has none: set checkpoint.snapshot = \"copy\" (or \"auto\")",
        where({"checkpoint.snapshot", "parallel.offload", "train.save_every"}));
  if (c.checkpoint.memory_every > 0 && c.train.save_every <= 0)
    fail(
        "{}: checkpoint.memory_every = {} keeps snapshots in memory between checkpoint files, "
        "and train.save_every = {} writes none: set train.save_every (the files every N "
        "steps), or remove memory_every",
        where({"checkpoint.memory_every", "train.save_every"}), c.checkpoint.memory_every,
        c.train.save_every);
  if (c.checkpoint.memory_every > 0 && p.offload == "nvme")
    fail(
        "{}: checkpoint.memory_every snapshots the state in memory, and NVMe-offloaded AdamW "
        "state is in a file: remove memory_every (the checkpoint files hold it), or offload "
        "to \"cpu\"",
        where({"checkpoint.memory_every", "parallel.offload"}));
  if (c.checkpoint.memory_every > 0 && c.checkpoint.memory_dir.empty())
    fail("{}: checkpoint.memory_dir is empty: name a directory on a tmpfs (/dev/shm)",
         where({"checkpoint.memory_dir"}));
  if (!p.offload_params && (p.offload != "nvme" || p.zero != 3))
    fail(
        "{}: parallel.offload_params = false keeps ZeRO-3's parameter shares in memory beside "
        "NVMe-offloaded AdamW state; with offload = \"{}\" and zero = {} there are none to "
        "keep: remove it",
        where({"parallel.offload_params", "parallel.offload", "parallel.zero"}), p.offload, p.zero);
  if (p.offload == "nvme" && (p.nvme_block_kb % 4 != 0))
    fail("{}: parallel.nvme_block_kb = {} must be a multiple of 4 (direct I/O moves whole pages)",
         where({"parallel.nvme_block_kb"}), p.nvme_block_kb);
  // AdamW on the host (optim/host_offload.h) keeps one set of moments: a swap snapshot's
  // second set is not built for it.
  if (p.offload == "cpu" && c.train.device == "cuda" && c.train.save_every > 0 &&
      c.checkpoint.snapshot == "swap")
    fail(
        "{}: checkpoint.snapshot = \"swap\" keeps a second set of the state, which AdamW "
        "offloaded to the host (parallel.offload = \"cpu\" with train.device = \"cuda\") "
        "does not have: set checkpoint.snapshot = \"copy\" (or \"auto\")",
        where({"checkpoint.snapshot", "parallel.offload", "train.save_every"}));
  if (p.zero_live_units != 2 && p.zero != 3)
    fail(
        "{}: parallel.zero_live_units = {} bounds the units ZeRO-3 holds gathered, and "
        "parallel.zero = {} gathers none: set parallel.zero = 3 or remove zero_live_units",
        where({"parallel.zero_live_units", "parallel.zero"}), p.zero_live_units, p.zero);
}

}  // namespace

void check_combinations(const Config& c, const std::map<std::string, std::string>& origins,
                        const std::string& name) {
  // The origin of the first named key that the recipe set, for "file:line:col: ..." prefixes.
  auto where = [&](std::initializer_list<std::string_view> keys) {
    for (auto k : keys)
      if (auto it = origins.find(std::string(k)); it != origins.end()) return it->second;
    return name;
  };
  const ModelConfig& m = c.model;
  if (m.d_model % m.n_head != 0)
    fail("{}: model.d_model ({}) must be divisible by model.n_head ({})",
         where({"model.d_model", "model.n_head"}), m.d_model, m.n_head);
  if (m.n_kv_head > m.n_head)
    fail("{}: model.n_kv_head ({}) must be in [0, model.n_head ({})]", where({"model.n_kv_head"}),
         m.n_kv_head, m.n_head);
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0)
    fail("{}: model.n_head ({}) must be divisible by model.n_kv_head ({})",
         where({"model.n_kv_head", "model.n_head"}), m.n_head, m.n_kv_head);
  if (m.family == ModelFamily::GPT2 && m.n_kv_head != 0 && m.n_kv_head != m.n_head)
    fail(
        "{}: model.n_kv_head ({}) must be 0 or model.n_head ({}) when model.family = \"gpt2\" "
        "(GPT-2 has no grouped-query attention; use family \"llama\")",
        where({"model.n_kv_head", "model.family"}), m.n_kv_head, m.n_head);
  if (m.family == ModelFamily::LLaMA && m.head_dim() % 2 != 0)
    fail(
        "{}: head_dim = model.d_model / model.n_head = {} / {} = {} must be even when "
        "model.family = \"llama\" (RoPE rotates pairs of dimensions)",
        where({"model.d_model", "model.n_head", "model.family"}), m.d_model, m.n_head,
        m.head_dim());
  if (c.train.seq_len > m.max_seq_len)
    fail("{}: train.seq_len ({}) must be at most model.max_seq_len ({})",
         where({"train.seq_len", "model.max_seq_len"}), c.train.seq_len, m.max_seq_len);
  const std::string& source = c.data.source;
  if ((source == "megatron" || source == "llmc" || source == "tokens") && c.data.path.empty())
    fail("{}: data.path is required when data.source = \"{}\" ({})", where({"data.source"}), source,
         source == "megatron" ? "prefix of a .bin/.idx pair"
         : source == "llmc"   ? "an llm.c .bin shard or a glob of them"
                              : "a pentad token file");
  if (c.train.out_dir.empty())
    fail("{}: train.out_dir must not be empty", where({"train.out_dir"}));
  if (c.train.precision == "bf16" && c.train.device != "cuda")
    fail(
        "{}: train.precision = \"bf16\" needs train.device = \"cuda\" (the CPU kernels "
        "compute in fp32): set train.precision = \"fp32\" or train on a GPU",
        where({"train.precision", "train.device"}));
  if (c.train.attention == "cudnn" && c.train.device != "cuda")
    fail(
        "{}: train.attention = \"cudnn\" needs train.device = \"cuda\" (cuDNN runs on the "
        "GPU; the CPU runs pentad's attention): set train.attention = \"auto\" or train on a "
        "GPU",
        where({"train.attention", "train.device"}));
  if (c.train.device == "cuda" && c.parallel.pp > 1 && c.parallel.pp_link_delay_ms > 0)
    fail(
        "{}: parallel.pp_link_delay_ms = {} with train.device = \"cuda\": the simulated slow "
        "link posts sends late, out of the order NCCL matches pipeline transfers by "
        "(parallel/pp/rounds.h): set parallel.pp_link_delay_ms = 0 or train on the CPU",
        where({"parallel.pp_link_delay_ms", "train.device"}), c.parallel.pp_link_delay_ms);
  // CUDA's attention: pentad's kernel takes any head_dim up to 256 (above 128 its output
  // tile lives in shared memory, which sm_90 has room for); cuDNN's fused attention takes
  // multiples of 8 up to 256 on Hopper, and "auto" falls back to pentad's kernel elsewhere.
  if (c.train.device == "cuda" && m.head_dim() > 256)
    fail(
        "{}: head_dim = model.d_model / model.n_head = {} / {} = {} is above 256, the largest "
        "the attention kernels take with train.device = \"cuda\" (pentad's kernel: up to 256; "
        "cuDNN's: multiples of 8 up to 256 on Hopper): raise model.n_head",
        where({"model.d_model", "model.n_head", "train.device"}), m.d_model, m.n_head,
        m.head_dim());
  if (c.train.device == "cuda" && c.train.attention == "cudnn" && m.head_dim() % 8 != 0)
    fail(
        "{}: head_dim = model.d_model / model.n_head = {} / {} = {} with train.attention = "
        "\"cudnn\": cuDNN's fused attention takes head sizes that are multiples of 8 (up to "
        "256): set train.attention = \"auto\" (pentad's kernel takes any up to 256) or change "
        "model.n_head",
        where({"model.d_model", "model.n_head", "train.attention"}), m.d_model, m.n_head,
        m.head_dim());
  check_context(c, where);
  check_moe(c, where);
  check_zero(c, where);
}

}  // namespace pentad::recipe
