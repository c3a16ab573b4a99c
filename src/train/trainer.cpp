#include "train/trainer.h"

#include <mpi.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/device_memory.h"
#include "core/npy.h"
#include "data/corpus.h"
#include "kernels/ops.h"
#include "parallel/pp/layout.h"
#include "train/recipe.h"

namespace pentad {

void set_compute_threads(int64_t threads, int ranks_on_node) {
  const int n = threads > 0 ? static_cast<int>(threads)
                            : std::max(1, omp_get_num_procs() / std::max(1, ranks_on_node));
  omp_set_num_threads(n);
}

// This rank's place among the ranks sharing its machine (they share its cores and GPUs):
// {local rank, local size}.
static std::pair<int, int> node_rank_and_size() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0, size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}

static int ranks_on_this_node() {
  return node_rank_and_size().second;
}

Placement placement(const Config& cfg) {
  Placement p;
  p.device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  p.compute = cfg.train.precision == "bf16" ? DType::BF16 : DType::F32;
  return p;
}

parallel::Backend select_device(const Config& cfg) {
  if (placement(cfg).device == Device::CPU) return parallel::Backend::MPI;
  int initialized = 0;
  MPI_Initialized(&initialized);
  select_cuda_device(initialized ? node_rank_and_size().first : 0);
  return parallel::Backend::NCCL;
}

parallel::pp::ScheduleSpec schedule_spec(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  parallel::pp::ScheduleSpec spec;
  // "adaptive" runs kFkB and re-chooses its group as it goes.
  spec.kind = p.pp_schedule == "adaptive" ? parallel::pp::ScheduleKind::KFKB
                                          : parallel::pp::parse_schedule(p.pp_schedule);
  spec.stages = int(p.pp);
  spec.micro_batches = int(cfg.train.grad_accum);
  spec.virtual_stages = int(p.virtual_stages);
  spec.group = int(std::min(p.pp_group, cfg.train.grad_accum));
  return spec;
}

parallel::MeshConfig mesh_config(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  parallel::MeshConfig mesh;
  mesh.tp = static_cast<int>(p.tp);
  mesh.cp = static_cast<int>(p.cp);
  mesh.pp = static_cast<int>(p.pp);
  mesh.order = p.order;
  const int64_t others = p.tp * p.cp * p.pp;
  if (p.dp > 0)
    mesh.dp = static_cast<int>(p.dp);
  else if (world_size % others == 0)
    mesh.dp = static_cast<int>(world_size / others);
  else
    fail(
        "parallel.tp ({}) x parallel.cp ({}) x parallel.pp ({}) = {} does not divide the {} "
        "ranks started: change parallel.tp or start a multiple of {} ranks",
        p.tp, p.cp, p.pp, others, world_size, others);
  parallel::validate(mesh, world_size);
  if (p.pp > 1 || p.virtual_stages > 1 || !p.pp_layout.empty()) {
    parallel::pp::check_schedule(schedule_spec(cfg));
    parallel::pp::chunk_layers(cfg.model.n_layer, int(p.pp), int(p.virtual_stages), p.pp_layout);
  }
  parallel::check_layout(mesh, cfg.model.n_head, cfg.model.n_kv_head, cfg.model.vocab_size,
                         ffn_dim(cfg.model), cfg.model.n_layer, cfg.train.seq_len,
                         cfg.train.micro_batch, p.sequence_parallel);
  return mesh;
}

Trainer::Trainer(const Config& cfg, parallel::Mesh* mesh) : cfg_(cfg), mesh_(mesh) {
  set_compute_threads(cfg.train.threads, mesh_ ? ranks_on_this_node() : 1);
  if (!mesh_) select_device(cfg);  // with a mesh, the launcher chose it before the mesh
  const TrainConfig& t = cfg.train;
  if (mesh_) {
    world_rank_ = mesh_->world_rank();
    dp_size_ = mesh_->degree(parallel::Axis::DP);
    dp_rank_ = mesh_->coord(parallel::Axis::DP);
    pp_size_ = mesh_->degree(parallel::Axis::PP);
    pp_rank_ = mesh_->coord(parallel::Axis::PP);
    // The default corpus is tokenized once, by rank 0, before anyone opens it.
    if (cfg.data.source == "fortunes" && world_rank_ == 0)
      data::prepare_default_corpus(cfg.data, cfg.model.vocab_size);
    mesh_->world().barrier();
  }
  data_ = std::make_unique<data::DataLoader>(
      data::DataLoader::open(cfg.data, t.seq_len, cfg.model.vocab_size, t.seed));
  model_ = parallelize(cfg, mesh_, placement(cfg), wiring_);
  model_->params().initialize(t.seed);
  kernels::refresh_weights(model_->params());
  if (pp_size_ > 1) {
    parallel::Communicator& stages = mesh_->group(parallel::Axis::PP);
    if (cfg.parallel.pp_link_delay_ms > 0)
      stages.set_injection({cfg.parallel.pp_link_delay_ms * 1e-3, -1, 0, /*links_only=*/true});
    pipeline_ =
        std::make_unique<parallel::pp::Pipeline>(*wiring_.stage, stages, schedule_spec(cfg));
  }
  optimizer_ = std::make_unique<AdamW>(cfg.optim, model_->params());
  if (mesh_ && mesh_->dp_cp().size() > 1)
    reducer_ = std::make_unique<parallel::GradReducer>(
        mesh_->dp_cp(), model_->params(),
        static_cast<size_t>(static_cast<double>(cfg.parallel.bucket_mb) * 1024 * 1024));
  inputs_.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets_.resize(inputs_.size());
}

void Trainer::fetch_batch(int64_t step, int64_t micro, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) const {
  const TrainConfig& t = cfg_.train;
  // The global batch of a step is a contiguous range of the sampler's order; micro-batch m
  // of data-parallel rank r takes slice m * dp + r. One rank reads the same range in the
  // same order, so the data never depends on the layout.
  const int64_t global_batch = t.micro_batch * t.grad_accum * dp_size_;
  inputs.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets.resize(inputs.size());
  data_->train_samples(step * global_batch + (micro * dp_size_ + dp_rank_) * t.micro_batch,
                       t.micro_batch, inputs.data(), targets.data());
}

StepStats Trainer::train_step(int64_t step, const std::function<void()>& after_backward) {
  const TrainConfig& t = cfg_.train;
  auto start = std::chrono::steady_clock::now();
  StepStats s;
  s.start_ns = parallel::trace_now_ns();
  ParamStore& params = model_->params();
  params.zero_grads();
  // Each token of the global batch weighs the same; data-parallel ranks' gradients are summed.
  const float dloss =
      1.0f / static_cast<float>(t.micro_batch * t.seq_len * t.grad_accum * dp_size_);
  double loss_sum = 0.0;
  GradsReady on_ready;
  if (reducer_) on_ready = [this](int64_t offset) { reducer_->ready_from(offset); };
  if (pipeline_) {
    loss_sum = pipeline_->train(
        step,
        [&](int micro, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
          fetch_batch(step, micro, inputs, targets);
        },
        dloss, on_ready);
  } else {
    for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
      fetch_batch(step, micro, inputs_, targets_);
      loss_sum += model_->forward(inputs_.data(), targets_.data(), dloss);
      model_->backward(micro + 1 == t.grad_accum, on_ready);
    }
  }
  s.backward_end_ns = parallel::trace_now_ns();
  if (pipeline_) {  // for the timeline, which keeps the spans of the last steps only
    step_starts_.push_back({step, s.start_ns});
    if (step_starts_.size() > size_t(pipeline_->keep_steps()))
      step_starts_.erase(step_starts_.begin());
  }
  if (reducer_) reducer_->finish();
  // Tied embeddings under pipelining: the first and last stages' tables get the sum of
  // both gradients, so they stay equal.
  if (parallel::Communicator* ends = mesh_ ? mesh_->embedding_group() : nullptr)
    if (cfg_.model.tie_embeddings) {
      const int id = model_->embedding_copy() >= 0 ? model_->embedding_copy() : model_->embedding();
      ends->all_reduce(params.grad(id));
    }
  s.reduced_ns = parallel::trace_now_ns();
  if (after_backward) after_backward();
  s.step = step;
  // The loss is known on the last stage: summed over stages, then over data-parallel ranks.
  s.loss = static_cast<float>(all_reduce_dp(all_reduce_pp(loss_sum)) /
                              static_cast<double>(t.grad_accum * dp_size_));
  GradSquares squares = grad_sum_squares(params);
  if (model_->tp().degree() > 1)  // shards add up over tp; replicated ones count once
    mesh_->group(parallel::Axis::TP).all_reduce(view_of(&squares.sharded, Shape{1}, DType::F64));
  s.grad_norm = std::sqrt(all_reduce_pp(squares.sharded + squares.replicated));
  clip_gradients(params, s.grad_norm, cfg_.optim.grad_clip);
  s.lr = learning_rate(cfg_.optim, step, t.steps);
  if (pipeline_ && cfg_.parallel.pp_schedule == "adaptive" &&
      (step + 1) % cfg_.parallel.pp_adapt_every == 0)
    adapt_pipeline_group();
  optimizer_->step(params, s.lr, snapshot_copied());  // a snapshot in flight copies first
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = static_cast<double>(t.micro_batch * t.seq_len * t.grad_accum * dp_size_);
  s.tokens_per_second = tokens / s.seconds;
  s.flops_per_second =
      model_->flops_per_micro_batch() * static_cast<double>(t.grad_accum) / s.seconds;
  return s;
}

double Trainer::all_reduce_pp(double value) {
  if (pp_size_ > 1)
    mesh_->group(parallel::Axis::PP).all_reduce(view_of(&value, Shape{1}, DType::F64));
  return value;
}

double Trainer::all_reduce_dp(double value) {
  if (dp_size_ > 1)
    mesh_->group(parallel::Axis::DP).all_reduce(view_of(&value, Shape{1}, DType::F64));
  return value;
}

float Trainer::evaluate() {
  // Data-parallel ranks share the eval batches (batch i on rank i % dp); every rank of a
  // tp group evaluates the same batches together.
  const TrainConfig& t = cfg_.train;
  double sum = 0.0;
  if (pipeline_) {
    const int count = int((t.eval_batches - dp_rank_ + dp_size_ - 1) / dp_size_);
    sum = pipeline_->evaluate(
        count, [&](int micro, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
          inputs.resize(inputs_.size());
          targets.resize(inputs_.size());
          data_->val_samples((dp_rank_ + int64_t(micro) * dp_size_) * t.micro_batch, t.micro_batch,
                             inputs.data(), targets.data());
        });
  } else {
    for (int64_t i = dp_rank_; i < t.eval_batches; i += dp_size_) {
      data_->val_samples(i * t.micro_batch, t.micro_batch, inputs_.data(), targets_.data());
      sum += model_->forward(inputs_.data(), targets_.data(), 0.0f);
    }
  }
  return static_cast<float>(all_reduce_dp(all_reduce_pp(sum)) /
                            static_cast<double>(t.eval_batches));
}

void Trainer::write_comm_log(const std::string& dir) const {
  std::filesystem::create_directories(dir);
  nlohmann::json events = nlohmann::json::array(), steps = nlohmann::json::array();
  for (const parallel::CommEvent& e : parallel::comm_events())
    events.push_back({{"comm", std::string(e.name())},
                      {"seq", e.seq},
                      {"kind", parallel::comm_kind_name(e.kind)},
                      {"bytes", e.bytes},
                      {"peer", e.peer},
                      {"enter_ns", e.enter_ns},
                      {"leave_ns", e.leave_ns}});
  for (const StepStats& s : history_)
    steps.push_back({{"step", s.step + 1},
                     {"start_ns", s.start_ns},
                     {"backward_end_ns", s.backward_end_ns},
                     {"reduced_ns", s.reduced_ns},
                     {"seconds", s.seconds}});
  nlohmann::json log = {{"rank", world_rank_},
                        {"tp", model_->tp().degree()},
                        {"dp", dp_size_},
                        {"pp", pp_size_},
                        {"sequence_parallel", model_->tp().sequence_parallel()},
                        {"micro_batch", cfg_.train.micro_batch},
                        {"seq_len", cfg_.train.seq_len},
                        {"d_model", cfg_.model.d_model},
                        {"n_layer", cfg_.model.n_layer},
                        {"grad_accum", cfg_.train.grad_accum},
                        {"parameters_local", model_->params().numel()},
                        {"steps", steps},
                        {"events", events}};
  std::ofstream(fmt::format("{}/rank{}.json", dir, world_rank_)) << log.dump();
}

void Trainer::dump_weights(const std::string& dir) const {
  dump_shards(dir, false);
}

void Trainer::dump_shards(const std::string& dir, bool grads) const {
  if (dp_rank_ != 0) return;
  std::filesystem::create_directories(dir);
  const ParamStore& p = model_->params();
  const int tp_rank = model_->tp().rank();
  nlohmann::json shards = nlohmann::json::array();
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    if (spec.pipeline_copy) continue;  // the first stage writes the original
    const std::string file = fmt::format("{}.tp{}.npy", spec.name, tp_rank);
    std::vector<float> host(static_cast<size_t>(spec.local_shape.numel()));
    if (grads)
      copy(view_of(host.data(), spec.local_shape), p.grad(id));
    else
      host = p.to_host(id);
    write_npy(dir + "/" + file, view_of(host.data(), spec.local_shape));
    std::vector<int64_t> shape(spec.global_shape.dims.begin(),
                               spec.global_shape.dims.begin() + spec.global_shape.ndim);
    shards.push_back({{"name", spec.name},
                      {"file", file},
                      {"global_shape", shape},
                      {"shard_dim", spec.shard_dim},
                      {"shard_start", spec.shard_start}});
  }
  std::ofstream(fmt::format("{}/shards.pp{}.tp{}.json", dir, pp_rank_, tp_rank)) << shards.dump(1);
}

std::string Trainer::memory_plan() const {
  const ParamStore& p = model_->params();
  const size_t params = p.bytes() + p.compute_copy_bytes(), grads = p.bytes(),
               optim = 2 * p.bytes();
  size_t acts = model_->activation_bytes();
  std::string in_flight;
  if (pipeline_) {  // one slot per micro-batch the schedule keeps in flight on each chunk
    const parallel::pp::ScheduleSpec& spec = pipeline_->schedule();
    const std::vector<parallel::pp::Action> actions = parallel::pp::stage_actions(spec, pp_rank_);
    for (int c = 0; c < model_->chunks(); ++c) {
      std::vector<parallel::pp::Action> mine;
      for (const parallel::pp::Action& a : actions)
        if (a.chunk == c) mine.push_back(a);
      const int peak = parallel::pp::peak_in_flight(mine);
      acts += size_t(peak - model_->slots_made(c)) * model_->slot_bytes(c);
      in_flight +=
          fmt::format("{}chunk {} (layers {}-{}): {} micro-batches in flight x {}", c ? ", " : "; ",
                      c, model_->chunk(c).layer_begin, model_->chunk(c).layer_end - 1, peak,
                      format_bytes(model_->slot_bytes(c)));
    }
  }
  return fmt::format(
      "memory plan (this rank, {} {}): parameters {} ({} values{}) | gradients {} | AdamW state {} "
      "| "
      "activations {} (micro-batch {} x {}, recompute {}{}) | total {}",
      cfg_.train.device, cfg_.train.precision, format_bytes(params), p.numel(),
      p.compute_copy_bytes() ? ", f32 master + bf16 copy" : "", format_bytes(grads),
      format_bytes(optim), format_bytes(acts), cfg_.train.micro_batch, cfg_.train.seq_len,
      cfg_.model.recompute ? "on" : "off", in_flight, format_bytes(params + grads + optim + acts));
}

void Trainer::write_metrics(const std::string& json_line) {
  if (!logs()) return;
  metrics_ << json_line << '\n';
  metrics_.flush();
}

void Trainer::run() {
  const TrainConfig& t = cfg_.train;
  spdlog::info("data: {}", data_->describe());
  // Small data is not refused, but a run that reads its windows many times should say so.
  const int64_t global_batch = t.micro_batch * t.grad_accum * dp_size_;
  const double passes = double(t.steps) * double(global_batch) / double(data_->train_windows());
  spdlog::info("data: {} steps x {} samples = {:.3g} epoch{} over the {} training samples{}",
               t.steps, global_batch, passes, passes == 1 ? "" : "s", data_->train_windows(),
               global_batch > data_->train_windows() ? " (fewer than one global batch: windows "
                                                       "repeat within each step)"
               : passes > 1                          ? " (windows repeat)"
                                                     : "");
  const bool eval = t.eval_every > 0 && data_->val_windows() > 0;
  if (t.eval_every > 0 && !eval)
    spdlog::info(
        "eval: off, there is no validation data (data.val_fraction = 0 and no data.val_path)");
  int64_t parameters = 0;
  for (const ParamSpec& spec : model_->params().specs()) parameters += spec.global_shape.numel();
  spdlog::info("model: {} with {} layers, width {}, {} heads ({} kv), vocabulary {}: {} parameters",
               cfg_.model.family == ModelFamily::GPT2 ? "gpt2" : "llama", cfg_.model.n_layer,
               cfg_.model.d_model, cfg_.model.n_head, cfg_.model.kv_heads(), cfg_.model.vocab_size,
               parameters);
  spdlog::info("{}", memory_plan());
  spdlog::info("threads: {}", omp_get_max_threads());
  if (model_->params().device() == Device::CUDA)
    spdlog::info("device: {}", cuda_device_description());
  // Checkpoints are loaded and checked before anything is written: a refused resume
  // leaves the run's files as they were.
  if (!t.resume.empty() && !t.init_from.empty())
    fail(
        "train.init_from = {} and --resume {} are both set: resume continues a run, "
        "init_from starts a new one from another's weights; keep one",
        t.init_from, t.resume);
  if (!t.resume.empty()) start_step_ = resume(t.resume);
  if (!t.init_from.empty()) init_from(t.init_from);
  if (t.save_every > 0) check_checkpoint_roots();
  if (logs()) {
    std::filesystem::create_directories(t.out_dir);
    metrics_.open(std::filesystem::path(t.out_dir) / "metrics.jsonl",
                  t.resume.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics_) fail("cannot write {}/metrics.jsonl", t.out_dir);
    std::ofstream recipe(std::filesystem::path(t.out_dir) / "recipe.toml");
    recipe << recipe_to_toml(cfg_);
  }
  const int64_t last = t.stop_at > 0 ? std::min(t.stop_at, t.steps) : t.steps;
  const auto run_start = std::chrono::steady_clock::now();
  for (int64_t step = start_step_; step < last; ++step) {
    std::function<void()> dump;
    if (step == start_step_ && !dump_grads_dir_.empty())
      dump = [&] { dump_shards(dump_grads_dir_, true); };
    StepStats s = train_step(step, dump);
    history_.push_back(s);
    if (!std::isfinite(s.loss)) fail("loss is {} at step {}: training diverged", s.loss, step);
    commit_pending(false);
    if (t.save_every > 0 && ((step + 1) % t.save_every == 0 || step + 1 == last)) save(step + 1);
    nlohmann::json j = {
        {"step", step + 1},
        {"loss", s.loss},
        {"lr", s.lr},
        {"grad_norm", s.grad_norm},
        {"seconds", s.seconds},
        {"tokens_per_second", s.tokens_per_second},
        {"flops_per_second", s.flops_per_second},
        // wall time since the loop began: steps plus saving, eval, logging
        {"elapsed_seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count()}};
    write_metrics(j.dump());
    if (t.log_every > 0 &&
        ((step + 1) % t.log_every == 0 || step == start_step_ || step + 1 == last))
      spdlog::info(
          "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} "
          "GFLOP/s",
          step + 1, t.steps, s.loss, s.lr, s.grad_norm, s.tokens_per_second,
          s.flops_per_second / 1e9);
    if (eval && ((step + 1) % t.eval_every == 0 || step + 1 == last)) {
      float val = evaluate();
      write_metrics(nlohmann::json{{"step", step + 1}, {"eval_loss", val}}.dump());
      spdlog::info("step {:>5}/{} | eval loss {:.4f}", step + 1, t.steps, val);
    }
  }
  // Blocked time while training; the last snapshot's flush at exit is reported apart.
  const double blocked = saver_.blocked_seconds();
  commit_pending(true);
  if (saves_ > 0) {
    const double final_flush = saver_.blocked_seconds() - blocked;
    write_metrics(nlohmann::json{
        {"checkpoint_saves", saves_},
        {"checkpoint_blocked_seconds", blocked},
        {"checkpoint_final_flush_seconds",
         final_flush}}.dump());
    spdlog::info(
        "checkpoints: {} saves, training blocked {:.3f} s in all ({}), final flush {:.3f} s",
        saves_, blocked, cfg_.train.async_save ? "asynchronous" : "synchronous", final_flush);
  }
}

int Trainer::all_ranks(int value, parallel::ReduceOp op) {
  if (mesh_) mesh_->world().all_reduce(view_of(&value, Shape{1}, DType::I32), op);
  return value;
}

}  // namespace pentad
