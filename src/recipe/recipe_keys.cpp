#include "recipe/recipe_keys.h"

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

#define PENTAD_KEY(section, name, rule, meaning)                                        \
  Key {                                                                                 \
#section, #name, [](Config & c) -> Field { return &c.section.name; }, rule, meaning \
  }

// [moe] lives inside ModelConfig (the model reads it) but is a section of its own.
#define MOE_KEY(name, rule, meaning)                                                  \
  Key {                                                                               \
    "moe", #name, [](Config& c) -> Field { return &c.model.moe.name; }, rule, meaning \
  }

// Order here is the order recipe_to_toml writes. Rules that involve two keys (divisibility,
// seq_len <= max_seq_len, data.path for file sources) are in recipe.cpp, check_combinations.
const std::vector<Key>& key_table() {
  static const std::vector<Key> table = {
      PENTAD_KEY(
          model, family, one_of({"gpt2", "llama"}),
          "Architecture: gpt2 (LayerNorm, GELU, biases, learned positions) or llama (RMSNorm, "
          "SwiGLU, RoPE)"),
      PENTAD_KEY(model, n_layer, at_least(1), "Transformer blocks"),
      PENTAD_KEY(model, d_model, at_least(1), "Model width (hidden size); a multiple of n_head"),
      PENTAD_KEY(model, n_head, at_least(1),
                 "Attention (query) heads; head_dim = d_model / n_head, at most 256 on CUDA"),
      PENTAD_KEY(
          model, n_kv_head, at_least(0),
          "Key/value heads; 0: n_head (MHA); fewer, dividing n_head: grouped-query attention "
          "(llama only)"),
      PENTAD_KEY(
          model, d_ff, at_least(0),
          "MLP hidden width; 0: 4 x d_model (gpt2) or 8/3 x d_model rounded up to a multiple "
          "of 256 (llama)"),
      PENTAD_KEY(model, vocab_size, at_least(2),
                 "Vocabulary size; every token id of the data must be below it"),
      PENTAD_KEY(
          model, max_seq_len, at_least(1),
          "Longest sequence the model takes (gpt2: rows of the position embedding); at least "
          "train.seq_len"),
      PENTAD_KEY(model, norm_eps, above(0), "Epsilon of LayerNorm (gpt2) or RMSNorm (llama)"),
      PENTAD_KEY(model, rope_theta, above(0),
                 "Base of the RoPE frequencies (llama; gpt2 learns its positions)"),
      PENTAD_KEY(model, init_std, at_least(0),
                 "Std of the normal weight init; residual projections get init_std / sqrt(2 x "
                 "n_layer)"),
      PENTAD_KEY(model, tie_embeddings, any(),
                 "LM head shares the token embedding's weights; if unset: true for gpt2, false for "
                 "llama"),
      PENTAD_KEY(model, recompute, any(),
                 "Recompute each layer's activations in backward instead of keeping them (less "
                 "memory, a forward's more compute); \"auto\": on only where the memory plan "
                 "does not fit without it (train.memory_limit_mb, else a rank's share of its "
                 "machine's or, on CUDA, its GPU's memory)"),
      PENTAD_KEY(model, moe_layers, any(),
                 "Layers whose MLP is MoE: \"\" (dense), \"all\", \"every:N\", \"from:K\" or "
                 "indices \"1,3,5\""),
      PENTAD_KEY(model, n_experts, at_least(0),
                 "Routed experts per MoE layer; 0: no MoE (dense model)"),
      PENTAD_KEY(model, top_k, at_least(1), "Routed experts each token goes to"),
      PENTAD_KEY(model, d_ff_expert, at_least(0),
                 "Hidden width of each expert's MLP; 0: the dense MLP width (as d_ff)"),
      PENTAD_KEY(model, n_shared_experts, at_least(0),
                 "Always-on experts per MoE layer (one MLP that many times d_ff_expert wide); 0: "
                 "none"),

      MOE_KEY(score, one_of({"softmax", "sigmoid"}),
              "Router probabilities: a softmax over the experts, or a sigmoid per expert"),
      MOE_KEY(renormalize, any(), "Divide each token's top-k routing weights by their sum"),
      MOE_KEY(aux_loss_coef, at_least(0),
              "Weight of the Switch/GShard load-balancing loss over each micro-batch; 0: off"),
      MOE_KEY(seq_aux_loss_coef, at_least(0),
              "Weight of the same loss per sequence (DeepSeek-V3's complementary loss); 0: off"),
      MOE_KEY(z_loss_coef, at_least(0),
              "Weight of the router z-loss (mean squared logsumexp of the logits); 0: off"),
      MOE_KEY(bias_update_rate, at_least(0),
              "Aux-loss-free balancing (DeepSeek-V3): per-step move of each expert's selection "
              "bias; 0: off"),
      MOE_KEY(capacity_factor, at_least(0),
              "Expert capacity: at most ceil(factor x tokens x top_k / n_experts) tokens per "
              "micro-batch; 0: dropless"),

      PENTAD_KEY(optim, lr, at_least(0),
                 "Peak learning rate, reached after warmup; 0: weights never change (a run that "
                 "only measures)"),
      PENTAD_KEY(optim, min_lr_ratio, closed(0, 1),
                 "Final learning rate as a fraction of lr, reached at train.steps (cosine or "
                 "linear decay)"),
      PENTAD_KEY(optim, warmup_steps, at_least(0),
                 "Steps of linear warmup from lr / warmup_steps up to lr; 0: none"),
      PENTAD_KEY(optim, decay, one_of({"cosine", "linear", "constant"}),
                 "Learning-rate decay after warmup, down to lr x min_lr_ratio; constant: stays at "
                 "lr"),
      PENTAD_KEY(optim, beta1, half_open(0, 1), "AdamW's decay rate of the first moment"),
      PENTAD_KEY(optim, beta2, half_open(0, 1), "AdamW's decay rate of the second moment"),
      PENTAD_KEY(optim, eps, above(0),
                 "AdamW's epsilon, added to the square root of the second moment"),
      PENTAD_KEY(optim, weight_decay, at_least(0),
                 "AdamW's decoupled weight decay (none on norms and biases)"),
      PENTAD_KEY(optim, grad_clip, at_least(0),
                 "Clip the global gradient norm to this; 0: no clipping"),

      PENTAD_KEY(train, steps, at_least(0),
                 "Optimizer steps of the run; the lr schedule spans them"),
      PENTAD_KEY(train, micro_batch, at_least(1),
                 "Sequences per micro-batch, per data-parallel rank"),
      PENTAD_KEY(train, seq_len, at_least(1),
                 "Tokens per training sequence; at most model.max_seq_len"),
      PENTAD_KEY(train, grad_accum, at_least(1),
                 "Micro-batches per optimizer step (the pipeline's micro-batches when pp > 1)"),
      PENTAD_KEY(train, global_batch, at_least(0),
                 "Sequences per step under any layout: grad_accum = global_batch / (micro_batch "
                 "x dp); 0: micro_batch x grad_accum x dp"),
      PENTAD_KEY(train, seed, at_least(0), "Seed of the weight initialization and the data order"),
      PENTAD_KEY(train, eval_every, at_least(0),
                 "Evaluate on validation data every N steps and at the last; 0: never"),
      PENTAD_KEY(
          train, eval_batches, at_least(1),
          "Validation micro-batches per evaluation, shared out over the data-parallel ranks"),
      PENTAD_KEY(train, sample_every, at_least(0),
                 "Log a 32-token greedy sample from the current weights every N steps (world "
                 "rank 0; refused where rank 0 holds only part of the model); 0: never"),
      PENTAD_KEY(train, log_every, at_least(1),
                 "Log the step's loss every N steps (and the first and last step)"),
      PENTAD_KEY(train, threads, at_least(0),
                 "Compute threads per rank; 0: the CPUs the job may use (cgroup quota, cpuset, "
                 "affinity) / ranks"),
      PENTAD_KEY(
          train, memory_limit_mb, at_least(0),
          "Memory per rank, MiB, for the planned state (not resident memory); 0: CPU: its share "
          "of the job's cgroup or machine; CUDA: no check"),
      PENTAD_KEY(train, device, one_of({"cpu", "cuda"}),
                 "Where the model trains: cpu, or cuda (one GPU per rank, NCCL communicators)"),
      PENTAD_KEY(train, precision, one_of({"fp32", "bf16"}),
                 "bf16 (CUDA only): bf16 weight copy and activations; fp32 master weights, "
                 "parameter gradients, AdamW state"),
      PENTAD_KEY(train, attention, one_of({"auto", "cudnn", "pentad"}),
                 "CUDA attention: auto (cuDNN's flash attention where it can, bf16; else "
                 "pentad's), cudnn (error where it refuses), pentad"),
      PENTAD_KEY(
          train, out_dir, any(),
          "Run directory: metrics.jsonl, recipe.toml, and checkpoints unless ckpt_dir is set"),
      PENTAD_KEY(train, tensorboard, any(),
                 "Also write metrics.jsonl's scalars as TensorBoard event files in "
                 "<out_dir>/tensorboard"),
      PENTAD_KEY(train, save_every, at_least(0), "Save a checkpoint every N steps; 0: never"),
      PENTAD_KEY(train, ckpt_dir, any(), "Checkpoint directory; empty: <out_dir>/checkpoints"),
      PENTAD_KEY(train, ckpt_mirror, any(),
                 "Optional second checkpoint level (a shared store), written after ckpt_dir; "
                 "empty: none"),
      PENTAD_KEY(train, keep_last, at_least(0),
                 "How many of the newest committed checkpoints to keep; 0: all"),
      PENTAD_KEY(train, async_save, any(),
                 "Snapshot and write checkpoints in the background while training goes on; false: "
                 "training waits"),
      PENTAD_KEY(train, resume, any(),
                 "\"\": start fresh; \"latest\": the newest valid checkpoint in ckpt_dir; a "
                 "checkpoint, or a root of them (its newest)"),
      PENTAD_KEY(train, retire_newer, any(),
                 "Resuming a checkpoint older than the newest in ckpt_dir: move the newer ones to "
                 "<ckpt_dir>/retired/ (false: refuse the run)"),
      PENTAD_KEY(train, init_from, any(),
                 "Fine-tuning: weights only from a checkpoint directory or root; the optimizer "
                 "starts at step 0"),
      PENTAD_KEY(train, max_failed_saves, at_least(1),
                 "Stop once a checkpoint level has failed this many saves in a row (e.g. a full "
                 "disk) and failed_save_grace_s has passed"),
      PENTAD_KEY(train, failed_save_grace_s, at_least(0),
                 "Seconds failed saves in a row are tolerated (warned each time) while the "
                 "level's newest committed checkpoint stands; 0: max_failed_saves alone"),
      PENTAD_KEY(train, max_skipped_steps, at_least(0),
                 "Steps with a non-finite loss or gradient norm skipped (no update) per run; one "
                 "more ends it"),
      PENTAD_KEY(train, inject_nan_grad, any(),
                 "Test fault: \"RANK:STEP\" makes that rank's gradients NaN at that step; empty: "
                 "none"),
      PENTAD_KEY(train, inject_fault, any(),
                 "Test fault for `pentad launch`: \"KIND:RANK:STEP[:FACTOR]\" or "
                 "\"slowlink:A:B:STEP[:MS]\"; empty: none"),
      PENTAD_KEY(
          train, stop_at, at_least(0),
          "End this run at step N (0: train.steps); the lr schedule still spans train.steps"),

      PENTAD_KEY(data, source, one_of({"fortunes", "megatron", "llmc", "tokens", "random", "none"}),
                 "Tokens from: the fortune corpus, Megatron .bin/.idx, llm.c shards, a pentad "
                 "token file, random; none: not chosen yet (an imported model's recipe), "
                 "training refuses"),
      PENTAD_KEY(
          data, path, any(),
          "megatron: .bin/.idx prefix; llmc: a .bin shard or a glob; tokens: the token file"),
      PENTAD_KEY(data, val_path, any(),
                 "Separate validation data, in the source's format; empty: the tail of the stream "
                 "(val_fraction)"),
      PENTAD_KEY(data, val_fraction, half_open(0, 1),
                 "Without val_path: the fraction at the end of the stream held out for validation; "
                 "0: none"),
      PENTAD_KEY(data, tokenizer, any(),
                 "tokenizer.json or SentencePiece tokenizer.model (fortunes tokenize with it, "
                 "others take its EOT id); empty: fortunes learn a BPE"),
      PENTAD_KEY(data, cache_dir, any(),
                 "Directory where fortunes' automatic tokenization writes its tokens and "
                 "tokenizer"),

      PENTAD_KEY(parallel, tp, at_least(1), "Tensor parallel degree (Megatron column/row split)"),
      PENTAD_KEY(parallel, tp_shape, any(),
                 "2D tensor parallelism: \"d1xd2\" with d1 x d2 = tp; empty: tp x 1 (1D); "
                 "\"auto\": from parallel.topology"),
      PENTAD_KEY(parallel, tp_order, one_of({"row", "column"}),
                 "2D tp: adjacent ranks form a mesh row (row) or a mesh column (column)"),
      PENTAD_KEY(parallel, tp_chunks, at_least(1),
                 "2D tp: each layer's collectives in this many row pieces, overlapped with the "
                 "GEMMs of the others"),
      PENTAD_KEY(parallel, topology, any(),
                 "A `pentad probe` topology file (JSON) for tp_shape = \"auto\"; empty: none"),
      PENTAD_KEY(parallel, dp, at_least(0), "Data parallel degree; 0: world size / (tp x cp x pp)"),
      PENTAD_KEY(parallel, cp, at_least(1),
                 "Context parallel degree: each sequence split over cp ranks"),
      PENTAD_KEY(parallel, cp_impl, one_of({"ulysses", "ring", "hybrid"}),
                 "Attention over the cp ranks: all-to-all of heads, K/V ring (zig-zag), or "
                 "Ulysses inside a ring"),
      PENTAD_KEY(parallel, cp_ulysses, at_least(0),
                 "cp_impl = \"hybrid\" only: the Ulysses degree (adjacent ranks), dividing cp; 0 "
                 "otherwise"),
      PENTAD_KEY(parallel, pp, at_least(1), "Pipeline parallel degree (stages)"),
      PENTAD_KEY(parallel, ep, at_least(1),
                 "Expert parallel degree: MoE experts split over ep ranks (ep x etp divides dp x "
                 "cp x tp)"),
      PENTAD_KEY(parallel, etp, at_least(1),
                 "Expert tensor parallel degree: each expert's width split over etp ranks"),
      PENTAD_KEY(
          parallel, pp_schedule,
          one_of({"gpipe", "1f1b", "kfkb", "interleaved", "adaptive", "zb-h1", "zb-v"}),
          "Pipeline schedule over train.grad_accum micro-batches; adaptive: kfkb re-choosing "
          "its group; zb-h1, zb-v: zero-bubble (backward split into input and weight "
          "gradients)"),
      PENTAD_KEY(parallel, virtual_stages, at_least(1),
                 "Model chunks per pipeline stage (the interleaved schedule; 2 for zb-v)"),
      PENTAD_KEY(parallel, pp_group, at_least(1),
                 "kfkb: micro-batches per group (adaptive: the first group); at most "
                 "train.grad_accum"),
      PENTAD_KEY(parallel, pp_layout, any(),
                 "Layers per model chunk, e.g. \"3,5\"; \"balanced\": cut by each layer's "
                 "and the head's FLOPs, the head's chunk taking fewer layers; empty: an even "
                 "split"),
      PENTAD_KEY(parallel, pp_memory_mb, at_least(0),
                 "adaptive: activation memory per stage its group must fit, MiB; 0: no limit"),
      PENTAD_KEY(parallel, pp_adapt_every, at_least(1),
                 "adaptive: steps between re-choices of the group from measured compute and link "
                 "times; zb-h1, zb-v: between rebuilds of the lists (the first after step 2)"),
      PENTAD_KEY(parallel, pp_link_delay_ms, at_least(0),
                 "Simulated slow links (tests, benchmarks): each pipeline send arrives this many "
                 "ms late; 0: off"),
      PENTAD_KEY(parallel, ring_all_reduce, any(),
                 "Data-parallel all-reduce (ZeRO 0, host memory) as pentad's ring, timed per "
                 "peer; false: MPI's own"),
      PENTAD_KEY(parallel, comm_backend, one_of({"auto", "nccl", "staged"}),
                 "Communicators: auto (CPU: MPI; CUDA: NCCL, staged where ranks share a GPU or "
                 "NCCL is not built), nccl, or staged (through host memory)"),
      PENTAD_KEY(parallel, sequence_parallel, any(),
                 "Shard norm and residual regions along the sequence over the tp ranks"),
      PENTAD_KEY(parallel, order, any(), "Mesh axes, innermost (fastest links) first"),
      PENTAD_KEY(parallel, bucket_mb, above(0),
                 "Data-parallel gradient bucket size, MiB (ZeRO 3: one bucket per layer)"),
      PENTAD_KEY(parallel, zero, closed(0, 3),
                 "ZeRO stage over dp x cp: 1 shards AdamW state, 2 also gradients, 3 also "
                 "parameters; 0: none"),
      PENTAD_KEY(parallel, zero_live_units, at_least(1),
                 "ZeRO 3: units (layers) each reducer holds gathered at once; 2 prefetches the "
                 "next, 1 prefetches none"),
      PENTAD_KEY(parallel, offload, one_of({"none", "cpu", "nvme"}),
                 "Where AdamW's state lives: beside the parameters, in host memory, or in a file "
                 "on NVMe"),
      PENTAD_KEY(parallel, offload_path, any(),
                 "offload = \"nvme\": the directory on the drive that holds AdamW's state file"),
      PENTAD_KEY(parallel, nvme_block_kb, at_least(4),
                 "NVMe offload: size of one io_uring request, KiB; a multiple of 4"),
      PENTAD_KEY(parallel, nvme_queue_depth, at_least(1),
                 "NVMe offload: requests in flight per direction"),
      PENTAD_KEY(parallel, nvme_subgroup_kb, above(0),
                 "NVMe offload: KiB of each state tensor streamed through host memory at a time"),
      PENTAD_KEY(parallel, offload_params, any(),
                 "offload = \"nvme\", zero = 3: this rank's parameter shares live in the file too; "
                 "false: in memory"),

      PENTAD_KEY(checkpoint, snapshot, one_of({"auto", "swap", "copy"}),
                 "How a save snapshots the state: copy (lazy, into a host buffer), swap (a second "
                 "set of it); auto: copy"),
      PENTAD_KEY(checkpoint, recycle_files, any(),
                 "Reuse retired checkpoints' rank files (in <ckpt_dir>/recycled) for the next "
                 "saves"),
      PENTAD_KEY(checkpoint, survivors, any(),
                 "On SIGTERM, write this rank's state for --resume latest to take where the ranks "
                 "left hold all of it (host state only)"),
      PENTAD_KEY(checkpoint, memory_every, at_least(0),
                 "Between checkpoint files, snapshot the state every N steps into host memory "
                 "that outlives the process (memory_dir); --resume latest takes it where newer; "
                 "0: never"),
      PENTAD_KEY(checkpoint, memory_dir, any(),
                 "memory_every: the directory (a tmpfs) that holds each rank's two snapshot "
                 "files"),
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
