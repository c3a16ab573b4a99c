#pragma once
// The training loop: one flat step (micro-batches -> gradient reduction -> clipping ->
// AdamW), eval every N steps, one log line per step and every metric as JSONL. Runs on one
// rank, or on every rank of a device mesh (data, tensor and pipeline parallel). The rank
// itself (threads, device) is set up before, by launch/rank.h.
// trainer.cpp: construction, train_step, evaluate; trainer_run.cpp: run; grad_sync.h: the
// step's gradient reduction per ZeRO stage; reports.cpp, memory_report.cpp, timeline.cpp:
// what it prints and writes; checkpoint_manager.h: saving, resuming, restoring (the Trainer
// owns a CheckpointManager and hands that work to it).
#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "data/dataset.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/dp/grad_reducer.h"
#include "parallel/mesh.h"
#include "parallel/pp/pipeline.h"
#include "plan/layout.h"
#include "recipe/config.h"
#include "train/checkpoint_manager.h"
#include "train/fault_injection.h"
#include "train/grad_sync.h"
#include "train/metrics_log.h"
#include "train/parallelize.h"

namespace pentad {

struct StepStats {
  int64_t step = 0;
  float loss = 0.0f;  // mean over the global batch's tokens
  float lr = 0.0f;
  double grad_norm = 0.0;  // before clipping
  double seconds = 0.0;
  double tokens_per_second = 0.0;  // global batch tokens per second
  double flops_per_second = 0.0;   // this rank's
  // On the communication trace's clock (parallel::trace_now_ns): step start, the end of the
  // last micro-batch's backward, and the moment every gradient reduction had finished.
  int64_t start_ns = 0, backward_end_ns = 0, reduced_ns = 0;
  // MoE (src/model/moe.h): the balancing and z losses, each the mean over the step's
  // micro-batches of the sum over MoE layers, and per MoE layer the picks each expert got
  // over the global batch (min / max / mean over experts) and the fraction dropped.
  double moe_aux = 0.0, moe_seq_aux = 0.0, moe_z = 0.0;
  struct MoeLayer {
    int64_t layer = 0;
    double min = 0, max = 0, mean = 0, dropped = 0;
    std::vector<double> tokens;  // picks per expert
  };
  std::vector<MoeLayer> moe_layers;
  bool skipped = false;  // loss or gradient norm not finite: nothing was updated
};

class Trainer {
 public:
  // mesh: null for one rank; otherwise every rank of the mesh constructs its Trainer.
  explicit Trainer(const Config& cfg, parallel::Mesh* mesh = nullptr);

  // One optimizer step on the global batch of `step`. after_backward (optional) sees the
  // reduced gradients before clipping and the optimizer.
  StepStats train_step(int64_t step, const std::function<void()>& after_backward = {});
  // Mean loss over eval_batches micro-batches of the validation stream.
  float evaluate();
  // The whole run: prints the memory plan, trains cfg.train.steps steps, logs, evaluates.
  void run();
  // Whether run() has reached its first step: an error before it is a refusal (the same
  // on every attempt), one after it a failure (launch/train_command.cpp).
  bool started() const { return started_; }

  Model& model() { return *model_; }
  const Config& config() const { return cfg_; }
  // ZeRO-2/3: the buffers the reducers' pools have made so far (GradReducer::buffers_made).
  int64_t zero_buffers_made() const;
  const AdamW& optimizer() const { return *optimizer_; }
  // This rank's micro-batch `micro` of step `step`: (b, t) inputs and targets (t: this
  // rank's tokens of each sequence under context parallelism). train/trainer_data.cpp.
  void fetch_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) const;
  // Sequences a step takes: micro_batch x grad_accum x dp (train.global_batch when set).
  int64_t global_batch() const;
  // The training order's index of step `step`'s first sample: the steps since the data
  // origin (step 0, or the resumed checkpoint's step and samples) times the global batch.
  int64_t first_sample(int64_t step) const {
    return data_samples_ + (step - data_step_) * global_batch();
  }
  // run() then writes, for each step, the training order's indices of the samples this
  // data-parallel replica read (<dir>/dp<r>.jsonl, by the replica's first rank), for the
  // resharding tests, which check that every sample is read exactly once.
  void dump_sample_ids(std::string dir) { samples_dir_ = std::move(dir); }
  // (b, seq_len) ids cut down to (b, t): the tokens at this rank's cp positions.
  void keep_local_tokens(std::vector<int32_t>& ids) const;
  parallel::pp::Pipeline* pipeline() { return pipeline_.get(); }

  // Reports (train/reports.cpp). The memory plan (train/memory_report.cpp): this rank's
  // parameters, gradients, optimizer state and activations.
  std::string memory_plan() const;
  // Writes this rank's parameter shards as .npy plus their global identity (shards.json),
  // when this rank is the first of its data-parallel replicas.
  void dump_weights(const std::string& dir);
  // run() then writes the first step's reduced gradients (before clipping) the same way,
  // for the layout tests, which compare them with one rank's.
  void dump_first_gradients(std::string dir) { dump_grads_dir_ = std::move(dir); }
  // run() then times every op of each step but the first (kernels/op_profile.h) and, at the
  // end, writes this rank's profile as JSON to `path` (one rank) or to `path` with
  // ".rank<r>" before its extension, and world rank 0 prints its table.
  void profile_ops(std::string path) { op_profile_path_ = std::move(path); }
  // Writes this rank's communication trace and step spans (rank<r>.json) for bench/.
  void write_comm_log(const std::string& dir) const;
  // Pipeline timeline (train/timeline.cpp): every rank's forward, backward and transfer-wait spans
  // of the last steps, gathered into one Chrome-trace JSON (opens in Perfetto) by world rank 0,
  // which returns the measured bubble fraction (-1 without pipelining; 0 on other ranks).
  // Collective.
  double write_timeline(const std::string& path);

  // Checkpoints: forwards to the CheckpointManager (train/checkpoint_manager.h), which says
  // what each does. Collective. resume() and restore_snapshot() return the step to train next
  // (restore_snapshot(): -1 when this job has saved nothing).
  void save(int64_t steps_done) { checkpoints_->save(steps_done); }
  void save_to_memory(int64_t steps_done) { checkpoints_->save_to_memory(steps_done); }
  void commit_pending(bool block) { checkpoints_->commit_pending(block); }
  int64_t resume(const std::string& which) { return start_step_ = checkpoints_->resume(which); }
  int64_t restore_snapshot() {
    const int64_t step = checkpoints_->restore_snapshot();
    if (step >= 0) start_step_ = step;
    return step;
  }
  std::string checkpoint_root() const { return CheckpointManager::root(cfg_.train); }
  // The local level, then the mirror.
  std::vector<std::string> checkpoint_roots() const { return CheckpointManager::roots(cfg_.train); }

 private:
  bool logs() const { return world_rank_ == 0; }
  // The ZeRO stage in effect: parallel.zero where dp x cp > 1 (nothing to shard otherwise).
  // (From the reducer: the constructor asks before grad_sync_ is built.)
  int zero_stage() const { return reducer_ ? reducer_->zero_stage() : 0; }
  // The tied embedding's parameter on this stage (the last stage's copy, or the original).
  int embedding_id() const {
    return model_->embedding_copy() >= 0 ? model_->embedding_copy() : model_->embedding();
  }
  // Reports (train/reports.cpp): the plan printed before training, then per step and eval
  // the log line and metrics.jsonl with its TensorBoard events (world rank 0 writes them,
  // beside recipe.toml; train/metrics_log.h).
  void log_plan() const;
  void open_run_files();
  // Rank 0, as the run starts: reads the run's tokenizer (data::run_tokenizer) into
  // tokenizer_ and writes a copy, with its sha256, to train.out_dir.
  void keep_tokenizer();
  // Every rank (node_share() is collective), as the run starts: the step line's throughput
  // basis below, from the recipe, the mesh, and the device's peak (a GPU's datasheet, or the
  // CPU's calibration, as `pentad plan` takes it).
  void set_throughput_basis();
  void write_metrics(const nlohmann::json& row);
  void report_step(const StepStats& s, std::chrono::steady_clock::time_point run_start,
                   int64_t last);
  void report_eval(int64_t step, float loss);
  // memory_plan()'s parts (train/memory_report.cpp): the parameters' and gradients' bytes
  // (shard: the bytes of this rank's ZeRO shares), the text on ZeRO and offloading, the
  // activations' bytes (note: context parallelism and the pipeline's slots) and the MoE
  // dispatch buffers' (experts: the values in routed experts).
  size_t planned_param_bytes() const;
  size_t planned_grad_bytes(size_t shard) const;
  std::string sharding_note(size_t shard) const;
  size_t planned_activation_bytes(std::string& note) const;
  size_t planned_dispatch_bytes(std::string& experts, std::string& note) const;
  // After a resume from the checkpoint at dir: the data order continues at the sample it
  // recorded (older ones: at its step times its run's global batch), and a global batch
  // other than the checkpoint's is said in one line.
  void continue_data_order(const ckpt::Manifest& manifest, const std::string& dir);
  void write_sample_ids() const;                    // dump_sample_ids()
  int all_ranks(int value, parallel::ReduceOp op);  // over the world; value alone on one rank
  std::string job_tag();  // the same on every rank of this job, another for the next (collective)
  double all_reduce_dp(double value);  // sum over dp of the mean over cp
  int64_t skipped_steps_ = 0;
  double all_reduce_pp(double value);  // sum over the pipeline stages
  // Adaptive kFkB (parallel/pp/adaptive.h): re-chooses the group size k from this step's
  // measured pass times and a measured stage-to-stage transfer.
  // After the step's backward, every pp_adapt_every steps, never after the run's last step
  // (lists no step would run, which the timeline would replay as if they had).
  void adapt_pipeline_group(int64_t step);
  int64_t last_step() const;  // the step run() stops before: train.steps, or train.stop_at
  // zb-h1, zb-v: the lists rebuilt for each stage's measured forward, B and W.
  void adapt_zero_bubble(int64_t step);
  // This stage's activations under a schedule: each chunk's slots (the most micro-batches
  // its lists hold) x the slot's bytes.
  double stage_activation_bytes(const parallel::pp::ScheduleSpec& spec) const;
  // MoE after the optimizer step: the step's statistics over the job into s, and the
  // aux-loss-free bias update from them.
  void finish_moe_step(StepStats& s);

  Config cfg_;
  parallel::Mesh* mesh_ = nullptr;
  int world_rank_ = 0;
  int dp_size_ = 1, dp_rank_ = 0;
  int cp_size_ = 1, cp_rank_ = 0;
  // Context parallelism: the positions of this rank's tokens within each sequence.
  std::vector<int32_t> cp_positions_;
  int pp_size_ = 1, pp_rank_ = 0;
  std::unique_ptr<FaultInjector> faults_;  // train.inject_fault, train.inject_nan_grad
  ModelWiring wiring_;                     // before model_ and pipeline_, which use it
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<data::DataLoader> data_;
  // ZeRO with MoE: both reducers' reduced shares, the dense then the experts' (declared
  // before the reducers, which write into it, so that it outlives them).
  Arena zero_grads_;
  std::unique_ptr<parallel::GradReducer> reducer_;
  std::unique_ptr<ParameterHooks> zero_params_;  // ZeRO-3: gathers each stretch's parameters
  // ZeRO-3: every parameter whole here (all = true) or back to this rank's shares only.
  void whole_parameters(bool all);
  // ZeRO-3 with the parameters on NVMe: the shares go to the optimizer's file, and the
  // reducer reads each unit's back from there before gathering it.
  void offload_parameter_shares();
  // Parameters on NVMe: every unit back to no share resident, each share read ahead landed
  // first (before the optimizer's file is streamed or rewritten, which must not race it).
  void settle_offloaded_shares();
  // MoE's aux-loss-free bias update (counts as Model::update_expert_bias's); with the
  // parameter shares on NVMe, on this rank's shares of the bias in the optimizer's file.
  void update_expert_bias(const std::vector<double>& counts);
  std::unique_ptr<parallel::GradReducer> expert_reducer_;  // MoE experts, over edp
  // The step's gradient reduction, per ZeRO stage, driving the reducers above.
  std::unique_ptr<GradSync> grad_sync_;
  // ZeRO: the reducers whose shares make up the optimizer's shard (the dense one, then the
  // experts' with MoE); at stage 3 they gather the parameters too.
  std::vector<parallel::GradReducer*> zero_reducers() const;
  // Host-offloaded AdamW: each bucket's reduced gradients come down as its reduction of the
  // step's last micro-batch is done (on), or no more (off: after the reducers finish).
  void download_grads_during_backward(bool on);
  bool grads_come_down_early() const;
  bool parameter_shares_in_file() const;  // ZeRO-3 with parallel.offload_params on NVMe
  // train/trainer_zero.cpp: reducer_ and expert_reducer_ (and zero_grads_) built; the
  // optimizer's shard over both; the reduced shares it reads (empty without ZeRO); the
  // global gradient norm; ZeRO's parameters gathered after the optimizer step.
  void build_reducers(size_t bucket_bytes);
  StateShard optimizer_shard() const;
  Tensor reduced_shares() const;
  // The global gradient norm, from this rank's squared sums (local; null: summed here).
  double grad_norm(const GradSquares* local = nullptr);
  // This rank's squared sums added on the device into sums (3 F64: GradSquares' order).
  void grad_squares_into(const Tensor& sums);
  bool counts_etp_replicated() const;
  // train_step()'s parts: the micro-batches' forward and backward (through the pipeline
  // with pp > 1), returning their loss sum; the tied embedding's gradients summed over its
  // two stages; clipping to optim.grad_clip; the pipelined steps' starts, for the timeline.
  double run_micro_batches(int64_t step, float dloss);
  void sum_tied_embedding();
  void clip_grads(double grad_norm);
  // The optimizer step (train/trainer_zero.cpp): around a snapshot in flight (the checkpoint
  // manager's side), then ZeRO's parameters gathered.
  void optimizer_step(float lr);
  void keep_step_start(int64_t step, int64_t start_ns);
  // The step's sums on a device: zeroed before the micro-batches; after them, read back
  // (loss added to loss_sum; false on the CPU, which keeps no such sums).
  void begin_step_sums();
  bool read_step_sums(double& loss_sum, GradSquares& squares);
  Tensor step_sums(int64_t first, int64_t count) const;
  // Training on a device: the step's loss sum and this rank's squared gradient sums (4 F64:
  // loss, then GradSquares') accumulate on the device and come back in the step's one
  // readback; nothing else in the step waits for the device.
  Arena step_sums_;
  StepReadback step_readback_;
  std::unique_ptr<parallel::pp::Pipeline> pipeline_;      // with pp > 1
  std::vector<std::pair<int64_t, int64_t>> step_starts_;  // pipelined steps: (step, start ns)
  int64_t lists_since_ = 0;  // the first step run with the pipeline's lists as they are now
  MetricsLog metrics_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<StepStats> history_;  // every step of run(), for write_comm_log
  // The run's tokenizer as it was when the run started (keep_tokenizer(), rank 0): every
  // checkpoint carries it (declared before checkpoints_, which reads it).
  KeptTokenizer tokenizer_;
  // Saves, commits, resumes, restores (train/checkpoint_manager.h); built last in the
  // constructor, from the model, the optimizer and the gradient sync.
  std::unique_ptr<CheckpointManager> checkpoints_;
  // The step line's throughput, counted as `pentad plan` counts it: model FLOPs a token,
  // the job's devices (ranks), and one device's peak FLOP/s (0: unknown; peak_note_ says
  // what MFU is against, or why there is none).
  double flops_per_token_ = 0, peak_flops_per_device_ = 0;
  int devices_ = 1;
  std::string peak_note_;
  bool above_peak_said_ = false;  // a step beat the peak: said once (report_step)
  double blocked_reported_ = 0;   // checkpoints_->blocked_seconds() at the last report_step()
  int64_t start_step_ = 0;        // first step run() trains (after a resume)
  int64_t data_step_ = 0, data_samples_ = 0;  // the data origin: first_sample(data_step_)
  std::string samples_dir_;                   // dump_sample_ids()
  // What fetch_batch() read, while samples_dir_ is set: (step, first sample, count).
  mutable std::mutex samples_read_mu_;
  mutable std::vector<std::array<int64_t, 3>> samples_read_;
  bool started_ = false;
  std::string dump_grads_dir_;    // dump_first_gradients()
  std::string op_profile_path_;   // profile_ops()
  void log_pipeline_cut() const;  // rank 0: the chunks' layers where they are not even
  void write_op_profile() const;
  void dump_shards(const std::string& dir, bool grads) const;
};

}  // namespace pentad
