#pragma once
// Everything a recipe can say: each section's configuration lives in the folder that
// owns it; this file adds [train] and composes them. Recipes are TOML (recipes/*.toml);
// src/recipe/recipe.cpp reads and validates them. Every field is one key "<section>.<name>".
#include <cstdint>
#include <string>

#include "checkpoint/config.h"
#include "data/config.h"
#include "model/config.h"
#include "optim/config.h"
#include "parallel/config.h"

namespace pentad {

struct TrainConfig {  // [train]
  int64_t steps = 100;
  int64_t micro_batch = 4;  // sequences per micro-batch (per data-parallel rank)
  int64_t seq_len = 64;
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  // Sequences per optimizer step, kept under any layout (Megatron's and torchtitan's
  // global batch): when > 0, grad_accum follows from it (global_batch / (micro_batch x dp),
  // apply_global_batch in plan/layout.h); 0: micro_batch x grad_accum x dp.
  int64_t global_batch = 0;
  uint64_t seed = 1234;
  int64_t eval_every = 50;  // 0 disables eval
  int64_t eval_batches = 4;
  int64_t sample_every = 0;  // rank 0 logs a short greedy sample every N steps; 0 = off
  int64_t log_every = 1;
  int64_t threads = 0;          // 0 = this machine's cores / ranks on it
  int64_t memory_limit_mb = 0;  // per rank; 0 = its share of this machine's memory
  // Where the model trains: "cpu", or "cuda" (one GPU per rank: local rank modulo the
  // visible devices; communicators use NCCL for device tensors). precision: "fp32", or
  // "bf16" (CUDA only): bf16 weights copy, activations and activation gradients, with fp32
  // master weights, parameter gradients, AdamW state and statistics.
  std::string device = "cpu";
  std::string precision = "fp32";
  // Attention on CUDA (kernels/ops.h, AttentionImpl): "auto" (cuDNN's fused flash attention
  // where it takes the call, bf16 only; pentad's kernel otherwise), "cudnn" (cuDNN for every
  // call it can take, fp32 staged through bf16; an error where cuDNN refuses) or "pentad"
  // (pentad's kernel only). CPU training always runs pentad's kernel.
  std::string attention = "auto";
  std::string out_dir = "runs/default";
  // Also write metrics.jsonl's scalars as TensorBoard event files in <out_dir>/tensorboard.
  bool tensorboard = true;
  // Checkpoints (checkpoint/): every save_every steps (0: never) into ckpt_dir (empty:
  // <out_dir>/checkpoints), keeping the newest keep_last; async_save copies the state in
  // the background while the next step computes. resume: "" (start fresh), "latest" (the
  // newest valid checkpoint in ckpt_dir, falling back past corrupt ones), a checkpoint path,
  // or a root that holds checkpoints (its newest valid one, as init_from takes).
  // A checkpoint of another model (model.* keys, data.tokenizer) is refused, never loaded.
  int64_t save_every = 0;
  std::string ckpt_dir;
  std::string ckpt_mirror;  // optional second level (a shared store), written after ckpt_dir
  int64_t keep_last = 3;
  bool async_save = true;
  std::string resume;
  // A resume of a checkpoint older than the newest in ckpt_dir (or the mirror) is refused: the
  // run's saves would replace the newer ones. true moves them to <root>/retired/ and goes on.
  bool retire_newer = false;
  // Weights only, for fine-tuning: a checkpoint directory (any layout, a converted one
  // included) or a root (its newest loadable checkpoint); the optimizer starts fresh at
  // step 0. Refused, like resume, when the checkpoint holds another model.
  std::string init_from;
  // Training stops once a checkpoint level (ckpt_dir or ckpt_mirror) has failed this many
  // saves in a row (a full disk), rather than running on unprotected ...
  int64_t max_failed_saves = 3;
  // ... and the first of them failed this many seconds ago, where the level's newest
  // committed checkpoint still stands (the newest snapshot stays in memory meanwhile): a
  // disk full for a moment costs no restart however short the steps. 0: the count alone.
  float failed_save_grace_s = 120;
  // A step whose loss or gradient norm is not finite updates nothing: its batch is dropped
  // (the optimizer, its moments and step count untouched), up to this many steps in a run;
  // one more ends the run.
  int64_t max_skipped_steps = 3;
  // Fault injection, for tests: "RANK:STEP" makes that rank's gradients NaN at that step.
  std::string inject_nan_grad;
  // Fault injection for the fault detector (launch/), in the first attempt of a `pentad
  // launch` job only (PENTAD_LAUNCH_ATTEMPT unset or 0; every attempt with
  // PENTAD_INJECT_EVERY_ATTEMPT set): "KIND:RANK:STEP[:FACTOR]" at the
  // start of step STEP (1-based) on world rank RANK. KIND: kill (SIGKILL), stop (SIGSTOP),
  // hang (computes forever), commhang (blocks forever in a receive nobody sends), slow
  // (from then on each step's compute takes FACTOR times as long), nan (that rank's
  // gradients NaN at that step, as inject_nan_grad), corrupt (once the checkpoint at or
  // before STEP is committed: flips bytes inside a tensor of this rank's file of it, or of
  // the first rank file if this rank wrote none, then SIGKILL). And "slowlink:A:B:STEP[:MS]": from
  // step STEP on, every send between world ranks A and B is delivered MS (default 20) ms late.
  std::string inject_fault;
  int64_t stop_at = 0;  // end this run after that many steps (0: train.steps); the schedule
                        // still spans train.steps, so a later --resume continues it exactly
};

struct Config {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  std::string recipe_path;  // for messages
};

}  // namespace pentad
