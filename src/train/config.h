#pragma once
// Everything a recipe can say. Recipes are TOML (recipes/*.toml); src/train/recipe.cpp
// reads and validates them. Every field here is one key "<section>.<name>".
#include <cstdint>
#include <string>

namespace pentad {

enum class ModelFamily { GPT2, LLaMA };

struct ModelConfig {                       // [model]
  ModelFamily family = ModelFamily::GPT2;  // family = "gpt2" | "llama"
  int64_t n_layer = 2;
  int64_t d_model = 64;  // width C
  int64_t n_head = 4;
  int64_t n_kv_head = 0;  // 0 = n_head (MHA); llama may use fewer (GQA)
  int64_t d_ff = 0;       // 0 = 4*C (gpt2) or the LLaMA rule (see model.cpp)
  int64_t vocab_size = 512;
  int64_t max_seq_len = 64;  // positions (gpt2 wpe rows) and the longest sequence
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;
  bool tie_embeddings = true;  // gpt2 ties; llama default false (recipes say so)
  bool recompute = false;      // recompute each layer's activations in backward

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
};

struct OptimConfig {  // [optim]
  float lr = 6e-4f;
  float min_lr_ratio = 0.1f;  // final lr = lr * min_lr_ratio
  int64_t warmup_steps = 10;
  std::string decay = "cosine";  // "cosine" | "linear" | "constant"
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // global-norm clip; 0 disables
};

struct TrainConfig {  // [train]
  int64_t steps = 100;
  int64_t micro_batch = 4;  // sequences per micro-batch (per data-parallel rank)
  int64_t seq_len = 64;
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  uint64_t seed = 1234;
  int64_t eval_every = 50;  // 0 disables eval
  int64_t eval_batches = 4;
  int64_t log_every = 1;
  int64_t threads = 0;          // 0 = this machine's cores / ranks on it
  int64_t memory_limit_mb = 0;  // per rank; 0 = its share of this machine's memory
  // Where the model trains: "cpu", or "cuda" (one GPU per rank: local rank modulo the
  // visible devices; communicators use NCCL for device tensors). precision: "fp32", or
  // "bf16" (CUDA only): bf16 weights copy, activations and activation gradients, with fp32
  // master weights, parameter gradients, AdamW state and statistics.
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string out_dir = "runs/default";
  // Checkpoints (checkpoint/): every save_every steps (0: never) into ckpt_dir (empty:
  // <out_dir>/checkpoints), keeping the newest keep_last; async_save copies the state in
  // the background while the next step computes. resume: "" (start fresh), "latest" (the
  // newest valid checkpoint in ckpt_dir, falling back past corrupt ones) or a checkpoint path.
  // A checkpoint of another model (model.* keys, data.tokenizer) is refused, never loaded.
  int64_t save_every = 0;
  std::string ckpt_dir;
  std::string ckpt_mirror;  // optional second level (a shared store), written after ckpt_dir
  int64_t keep_last = 3;
  bool async_save = true;
  std::string resume;
  // Weights only, for fine-tuning: a checkpoint directory (any layout, a converted one
  // included) or a root (its newest loadable checkpoint); the optimizer starts fresh at
  // step 0. Refused, like resume, when the checkpoint holds another model.
  std::string init_from;
  // Training stops once a checkpoint level (ckpt_dir or ckpt_mirror) has failed this many
  // saves in a row (a full disk), rather than running on unprotected.
  int64_t max_failed_saves = 3;
  int64_t stop_at = 0;  // end this run after that many steps (0: train.steps); the schedule
                        // still spans train.steps, so a later --resume continues it exactly
};

struct DataConfig {  // [data]
  // "fortunes": the Debian fortune-cookie corpus, tokenized on first use;
  // "megatron": path = prefix of a .bin/.idx pair; "llmc": path = llm.c .bin shard (or glob);
  // "tokens": path = pentad token file; "random": uniform random tokens (benchmarks).
  std::string source = "fortunes";
  std::string path;                // for megatron / llmc / tokens
  std::string val_path;            // optional separate validation file
  float val_fraction = 0.05f;      // when val_path is empty: tail of the stream
  std::string tokenizer;           // tokenizer.json path; empty = learn one (fortunes)
  std::string cache_dir = "data";  // where automatic tokenization writes
};

struct ParallelConfig {  // [parallel]: the device mesh (see parallel/mesh.h)
  int64_t tp = 1;        // tensor parallel (Megatron column/row) degree
  int64_t dp = 0;        // data parallel degree; 0 = world size / (tp * cp * pp)
  int64_t cp = 1;        // context parallel degree (not in this build: must be 1)
  int64_t pp = 1;        // pipeline degree (stages)
  // Pipeline schedule (parallel/pp/schedule.h) over train.grad_accum micro-batches:
  // "gpipe" | "1f1b" | "kfkb" (groups of pp_group micro-batches) | "interleaved"
  // (virtual_stages model chunks per stage) | "adaptive" (kfkb re-choosing its group every
  // pp_adapt_every steps from measured compute and link times, within pp_memory_mb of
  // activations per stage; 0 = no limit).
  std::string pp_schedule = "1f1b";
  int64_t virtual_stages = 1;
  int64_t pp_group = 2;
  std::string pp_layout;  // layers per model chunk, e.g. "3,5"; empty = even split
  float pp_memory_mb = 0.0f;
  int64_t pp_adapt_every = 10;
  // Simulated slow stage-to-stage links, for benchmarks and tests: every pipeline send is
  // delivered this many milliseconds late (the sender does not wait).
  float pp_link_delay_ms = 0.0f;
  bool sequence_parallel = false;     // shard norm/residual regions along the sequence over tp
  std::string order = "tp,cp,dp,pp";  // mesh axes, innermost (fastest links) first
  float bucket_mb = 4.0f;             // data-parallel gradient bucket size, MiB
};

struct Config {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  std::string recipe_path;  // for messages
};

}  // namespace pentad
