#include "train/recipe_keys.h"

#include <charconv>
#include <cmath>

namespace pentad::recipe {
namespace {

Rule any() {
  return {};
}
Rule interval(double lo, bool lo_open, double hi, bool hi_open) {
  Rule r;
  r.lo = lo, r.lo_open = lo_open, r.hi = hi, r.hi_open = hi_open;
  return r;
}
Rule at_least(double lo) {
  return interval(lo, false, kInf, false);
}
Rule above(double lo) {
  return interval(lo, true, kInf, false);
}
Rule closed(double lo, double hi) {
  return interval(lo, false, hi, false);
}
Rule half_open(double lo, double hi) {
  return interval(lo, false, hi, true);
}
Rule one_of(std::initializer_list<std::string_view> words) {
  Rule r;
  r.choices = words;
  return r;
}

}  // namespace

#define PENTAD_KEY(section, name, rule)                                        \
  Key {                                                                        \
#section, #name, [](Config & c) -> Field { return &c.section.name; }, rule \
  }

// [moe] lives inside ModelConfig (the model reads it) but is a section of its own.
#define MOE_KEY(name, rule)                                                  \
  Key {                                                                      \
    "moe", #name, [](Config& c) -> Field { return &c.model.moe.name; }, rule \
  }

// Order here is the order recipe_to_toml writes. Rules that involve two keys (divisibility,
// seq_len <= max_seq_len, data.path for file sources) are in recipe.cpp, check_combinations.
const std::vector<Key>& key_table() {
  static const std::vector<Key> table = {
      PENTAD_KEY(model, family, one_of({"gpt2", "llama"})),
      PENTAD_KEY(model, n_layer, at_least(1)),
      PENTAD_KEY(model, d_model, at_least(1)),
      PENTAD_KEY(model, n_head, at_least(1)),
      PENTAD_KEY(model, n_kv_head, at_least(0)),
      PENTAD_KEY(model, d_ff, at_least(0)),
      PENTAD_KEY(model, vocab_size, at_least(2)),
      PENTAD_KEY(model, max_seq_len, at_least(1)),
      PENTAD_KEY(model, norm_eps, above(0)),
      PENTAD_KEY(model, rope_theta, above(0)),
      PENTAD_KEY(model, init_std, at_least(0)),
      PENTAD_KEY(model, tie_embeddings, any()),
      PENTAD_KEY(model, recompute, any()),
      PENTAD_KEY(model, moe_layers, any()),
      PENTAD_KEY(model, n_experts, at_least(0)),
      PENTAD_KEY(model, top_k, at_least(1)),
      PENTAD_KEY(model, d_ff_expert, at_least(0)),
      PENTAD_KEY(model, n_shared_experts, at_least(0)),

      MOE_KEY(score, one_of({"softmax", "sigmoid"})),
      MOE_KEY(renormalize, any()),
      MOE_KEY(aux_loss_coef, at_least(0)),
      MOE_KEY(seq_aux_loss_coef, at_least(0)),
      MOE_KEY(z_loss_coef, at_least(0)),
      MOE_KEY(bias_update_rate, at_least(0)),
      MOE_KEY(capacity_factor, at_least(0)),  // 0: dropless

      PENTAD_KEY(optim, lr, at_least(0)),  // 0: a run that only measures
      PENTAD_KEY(optim, min_lr_ratio, closed(0, 1)),
      PENTAD_KEY(optim, warmup_steps, at_least(0)),
      PENTAD_KEY(optim, decay, one_of({"cosine", "linear", "constant"})),
      PENTAD_KEY(optim, beta1, half_open(0, 1)),
      PENTAD_KEY(optim, beta2, half_open(0, 1)),
      PENTAD_KEY(optim, eps, above(0)),
      PENTAD_KEY(optim, weight_decay, at_least(0)),
      PENTAD_KEY(optim, grad_clip, at_least(0)),

      PENTAD_KEY(train, steps, at_least(0)),
      PENTAD_KEY(train, micro_batch, at_least(1)),
      PENTAD_KEY(train, seq_len, at_least(1)),
      PENTAD_KEY(train, grad_accum, at_least(1)),
      PENTAD_KEY(train, seed, at_least(0)),
      PENTAD_KEY(train, eval_every, at_least(0)),
      PENTAD_KEY(train, eval_batches, at_least(1)),
      PENTAD_KEY(train, log_every, at_least(1)),
      PENTAD_KEY(train, threads, at_least(0)),
      PENTAD_KEY(train, memory_limit_mb, at_least(0)),
      PENTAD_KEY(train, device, one_of({"cpu", "cuda"})),
      PENTAD_KEY(train, precision, one_of({"fp32", "bf16"})),
      PENTAD_KEY(train, attention, one_of({"auto", "cudnn", "pentad"})),
      PENTAD_KEY(train, out_dir, any()),
      PENTAD_KEY(train, save_every, at_least(0)),
      PENTAD_KEY(train, ckpt_dir, any()),
      PENTAD_KEY(train, ckpt_mirror, any()),
      PENTAD_KEY(train, keep_last, at_least(0)),
      PENTAD_KEY(train, async_save, any()),
      PENTAD_KEY(train, resume, any()),
      PENTAD_KEY(train, init_from, any()),
      PENTAD_KEY(train, max_failed_saves, at_least(1)),
      PENTAD_KEY(train, max_skipped_steps, at_least(0)),
      PENTAD_KEY(train, inject_nan_grad, any()),
      PENTAD_KEY(train, inject_fault, any()),
      PENTAD_KEY(train, stop_at, at_least(0)),

      PENTAD_KEY(data, source, one_of({"fortunes", "megatron", "llmc", "tokens", "random"})),
      PENTAD_KEY(data, path, any()),
      PENTAD_KEY(data, val_path, any()),
      PENTAD_KEY(data, val_fraction, half_open(0, 1)),  // 0: no validation
      PENTAD_KEY(data, tokenizer, any()),
      PENTAD_KEY(data, cache_dir, any()),

      PENTAD_KEY(parallel, tp, at_least(1)),
      PENTAD_KEY(parallel, dp, at_least(0)),
      PENTAD_KEY(parallel, cp, at_least(1)),
      PENTAD_KEY(parallel, cp_impl, one_of({"ulysses", "ring", "hybrid"})),
      PENTAD_KEY(parallel, cp_ulysses, at_least(0)),
      PENTAD_KEY(parallel, pp, at_least(1)),
      PENTAD_KEY(parallel, ep, at_least(1)),
      PENTAD_KEY(parallel, etp, at_least(1)),
      PENTAD_KEY(parallel, pp_schedule,
                 one_of({"gpipe", "1f1b", "kfkb", "interleaved", "adaptive"})),
      PENTAD_KEY(parallel, virtual_stages, at_least(1)),
      PENTAD_KEY(parallel, pp_group, at_least(1)),
      PENTAD_KEY(parallel, pp_layout, any()),
      PENTAD_KEY(parallel, pp_memory_mb, at_least(0)),
      PENTAD_KEY(parallel, pp_adapt_every, at_least(1)),
      PENTAD_KEY(parallel, pp_link_delay_ms, at_least(0)),
      PENTAD_KEY(parallel, ring_all_reduce, any()),
      PENTAD_KEY(parallel, sequence_parallel, any()),
      PENTAD_KEY(parallel, order, any()),
      PENTAD_KEY(parallel, bucket_mb, above(0)),
      PENTAD_KEY(parallel, zero, closed(0, 3)),
      PENTAD_KEY(parallel, offload, one_of({"none", "cpu", "nvme"})),
      PENTAD_KEY(parallel, offload_path, any()),
      PENTAD_KEY(parallel, nvme_block_kb, at_least(4)),
      PENTAD_KEY(parallel, nvme_queue_depth, at_least(1)),
      PENTAD_KEY(parallel, nvme_subgroup_kb, above(0)),
      PENTAD_KEY(parallel, offload_params, any()),

      PENTAD_KEY(checkpoint, snapshot, one_of({"auto", "swap", "copy"})),
      PENTAD_KEY(checkpoint, recycle_files, any()),
  };
  return table;
}

#undef PENTAD_KEY
#undef MOE_KEY

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f)
          out += fmt::format("\\u{:04X}", ch);
        else
          out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string format_float(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  double back = 0;
  std::from_chars(s.data(), s.data() + s.size(), back);
  if (static_cast<float>(back) != v) s = fmt::format("{}", static_cast<double>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

const std::vector<std::string_view>& sections() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const Key& k : key_table())
      if (std::find(out.begin(), out.end(), k.section) == out.end()) out.push_back(k.section);
    return out;
  }();
  return names;
}

}  // namespace pentad::recipe
