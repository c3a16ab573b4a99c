#include "train/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <numeric>
#include <string_view>

#include "core/device_memory.h"
#include "data/corpus.h"
#include "kernels/ops.h"
#include "parallel/activity.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/pp/adaptive.h"
#include "parallel/pp/layout.h"
#include "recipe/recipe.h"

namespace pentad {

namespace {

// PENTAD_HOST_ADAMW=1: a CPU run with parallel.offload set updates through the host-offload
// path a device run takes (optim/host_offload.h), so that its logic is tested on CPU ranks.
bool host_adamw_forced() {
  const char* v = std::getenv("PENTAD_HOST_ADAMW");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace

Trainer::Trainer(const Config& recipe, parallel::Mesh* mesh) : cfg_(recipe), mesh_(mesh) {
  // Callers that built the mesh have applied it already (launch/train_command.cpp); tests may not.
  apply_global_batch(cfg_, mesh_ ? mesh_->degree(parallel::Axis::DP) : 1);
  const Config& cfg = cfg_;
  const TrainConfig& t = cfg.train;
  if (mesh_) {
    world_rank_ = mesh_->world_rank();
    dp_size_ = mesh_->degree(parallel::Axis::DP);
    dp_rank_ = mesh_->coord(parallel::Axis::DP);
    pp_size_ = mesh_->degree(parallel::Axis::PP);
    pp_rank_ = mesh_->coord(parallel::Axis::PP);
    cp_size_ = mesh_->degree(parallel::Axis::CP);
    cp_rank_ = mesh_->coord(parallel::Axis::CP);
    if (cp_size_ > 1) {
      const int U = mesh_->config().cp_ulysses;
      cp_positions_ =
          parallel::context_positions(t.seq_len, U, cp_size_ / U, cp_rank_ % U, cp_rank_ / U);
    }
    // The default corpus is tokenized once, by rank 0, before anyone opens it.
    if (cfg.data.source == "fortunes" && world_rank_ == 0)
      data::prepare_default_corpus(cfg.data, cfg.model.vocab_size);
    mesh_->world().barrier();
  }
  faults_ = std::make_unique<FaultInjector>(cfg_, mesh_, world_rank_, checkpoint_root());
  kernels::set_attention_impl(t.attention == "cudnn"    ? kernels::AttentionImpl::Cudnn
                              : t.attention == "pentad" ? kernels::AttentionImpl::Pentad
                                                        : kernels::AttentionImpl::Auto);
  data_ = std::make_unique<data::DataLoader>(
      data::DataLoader::open(cfg.data, t.seq_len, cfg.model.vocab_size, t.seed));
  Placement where = placement(cfg);
  if (mesh_ && mesh_->dp_cp().size() > 1) {  // ZeRO's sparse arenas (core/params.h)
    where.sparse_grads = cfg.parallel.zero >= 2;
    where.sparse_params = cfg.parallel.zero == 3;
  }
  model_ = parallelize(cfg, mesh_, where, wiring_);
  if (pp_size_ > 1) {
    parallel::Communicator& stages = mesh_->group(parallel::Axis::PP);
    if (cfg.parallel.pp_link_delay_ms > 0)
      stages.set_injection({cfg.parallel.pp_link_delay_ms * 1e-3, -1, 0, /*links_only=*/true});
    // zb-h1's held limits come from the recipe and the mesh (the memory plan's slot sizes),
    // so every rank runs the same lists; adapt_zero_bubble keeps them.
    pipeline_ = std::make_unique<parallel::pp::Pipeline>(*wiring_.stage, stages,
                                                         schedule_spec(cfg, mesh_->config()));
  }
  const auto bucket_bytes =
      static_cast<size_t>(static_cast<double>(cfg.parallel.bucket_mb) * 1024 * 1024);
  // parallel.ring_all_reduce: pentad's own ring, timed per peer (the link matrix).
  if (mesh_ && mesh_->dp_cp().size() > 1)
    mesh_->dp_cp().set_ring_all_reduce(cfg.parallel.ring_all_reduce);
  build_reducers(bucket_bytes);
  // After the reducers: with ZeRO-3 they decide which parameters this rank backs.
  model_->params().initialize(t.seed);
  kernels::refresh_weights(model_->params());
  NvmeOptions nvme;  // parallel.offload = "nvme": m and v (ZeRO-3: the parameters) in a file
  nvme.dir = cfg.parallel.offload_path;
  nvme.block_bytes = size_t(cfg.parallel.nvme_block_kb) * 1024;
  nvme.queue_depth = int(cfg.parallel.nvme_queue_depth);
  nvme.subgroup_elements = cfg.parallel.nvme_subgroup_kb * 1024 / int64_t(sizeof(float));
  optimizer_ = std::make_unique<AdamW>(
      cfg.optim, model_->params(), optimizer_shard(),
      cfg.parallel.offload == "nvme" ? &nvme : nullptr,
      fmt::format("pentad-adamw-rank{:05d}.state", world_rank_), parameter_shares_in_file(),
      // On CUDA either offload updates on the host (optim/host_offload.h), moments in host
      // memory or, with "nvme", in the file. PENTAD_HOST_ADAMW=1 makes a CPU run take the
      // same path (tests: the device run's streaming logic, on host memory).
      cfg.parallel.offload != "none" && (t.device == "cuda" || host_adamw_forced()));
  if (grads_come_down_early()) optimizer_->reserve_early_grads();
  grad_sync_ =
      GradSync::make(zero_stage(), model_->params(), {reducer_.get(), expert_reducer_.get()},
                     zero_stage() ? &optimizer_->shard() : nullptr, reduced_shares());
  if (pipeline_ && grad_sync_->reduces_each_pass()) {
    // ZeRO-2 and -3 under pipelining: each chunk's gradients reduced after each of its passes.
    model_->set_reduce_each_pass(true);
    pipeline_->set_grad_passes(
        [this, chunks = model_->chunk_param_offsets()](int c) {
          grad_sync_->before_pass(chunks[size_t(c)], chunks[size_t(c) + 1]);
        },
        [this](int) { grad_sync_->after_pass(); });
  }
  if (zero_stage() == 3) {
    std::vector<parallel::GradReducer*> gathering = zero_reducers();
    if (bug_injected("zero3-moe-skip-expert-gather"))  // planted for the layout test
      gathering.resize(1);
    zero_params_ = zero_parameters(gathering, model_->params(), int(cfg.parallel.zero_live_units));
    model_->set_parameter_hooks(zero_params_.get());
    if (optimizer_->params_offloaded()) offload_parameter_shares();
    // From here on each rank holds its shares only (or none).
    for (parallel::GradReducer* r : zero_reducers()) r->release_all();
  }
  if (pipeline_ && pipeline_->schedule().splits_backward()) {
    if (cfg.model.recompute && world_rank_ == 0)
      spdlog::warn(
          "model.recompute under parallel.pp_schedule = \"{}\" saves no memory: each "
          "micro-batch keeps what its weight gradients read (nearly all a layer's activations) "
          "until its W, and pays the forward again; 1f1b or interleaved are where recompute "
          "saves memory",
          cfg.parallel.pp_schedule);
  }
  checkpoints_ = std::make_unique<CheckpointManager>(CheckpointManager::Run{
      .cfg = cfg_,
      .mesh = mesh_,
      .model = *model_,
      .optimizer = *optimizer_,
      .grad_sync = *grad_sync_,
      .embedding_id = embedding_id(),
      .tokenizer = tokenizer_,
      .first_sample = [this](int64_t step) { return first_sample(step); },
      .continue_data_order = [this](const ckpt::Manifest& manifest,
                                    const std::string& dir) { continue_data_order(manifest, dir); },
      .settle_offloaded_shares = [this] { settle_offloaded_shares(); },
      .write_metrics = [this](const nlohmann::json& row) { write_metrics(row); }});
  inputs_.resize(static_cast<size_t>(t.micro_batch * t.seq_len));
  targets_.resize(inputs_.size());
}

StepStats Trainer::train_step(int64_t step, const std::function<void()>& after_backward) {
  const TrainConfig& t = cfg_.train;
  const auto start = std::chrono::steady_clock::now();
  StepStats s;
  s.step = step;
  s.start_ns = parallel::trace_now_ns();
  const double start_cpu = parallel::thread_cpu_seconds();
  faults_->before_step(step);
  grad_sync_->begin_step();
  // Each token of the global batch weighs the same; the gradients of data- and
  // context-parallel ranks are summed.
  float dloss = 1.0f / static_cast<float>(t.micro_batch * t.seq_len * t.grad_accum * dp_size_);
  if (faults_->nan_at(step)) dloss = std::numeric_limits<float>::quiet_NaN();
  begin_step_sums();
  optimizer_->forget_early_grads();  // host-offloaded AdamW: none of this step's yet
  double loss_sum = run_micro_batches(step, dloss);
  s.backward_end_ns = parallel::trace_now_ns();
  if (faults_->stretch_compute(start_cpu)) s.backward_end_ns = parallel::trace_now_ns();
  keep_step_start(step, s.start_ns);
  grad_sync_->finish();
  download_grads_during_backward(false);
  sum_tied_embedding();
  s.reduced_ns = parallel::trace_now_ns();
  if (after_backward) {  // whole reduced gradients, also where ZeRO holds shares
    grad_sync_->gather_grads();
    after_backward();
    grad_sync_->drop_gathered_grads();
  }
  GradSquares device_squares;
  const bool on_device = read_step_sums(loss_sum, device_squares);
  // The loss is known on the last stage: summed over stages, then over data-parallel ranks.
  s.loss = static_cast<float>(all_reduce_dp(all_reduce_pp(loss_sum)) /
                              static_cast<double>(t.grad_accum * dp_size_));
  s.grad_norm = grad_norm(on_device ? &device_squares : nullptr);
  s.lr = learning_rate(cfg_.optim, step, t.steps);
  // Both are reduced over every rank, so every rank takes the same branch.
  s.skipped = !std::isfinite(s.loss) || !std::isfinite(s.grad_norm);
  if (s.skipped) {
    if (cfg_.model.is_moe()) model_->take_moe_stats();  // this batch's routing counts nothing
    const auto writing = checkpoints_->writing_state();
    checkpoints_->live_step(step + 1);
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }
  clip_grads(s.grad_norm);
  adapt_pipeline_group(step);
  {  // the survivors' state (survivor_save.h) is never taken half written
    const auto writing = checkpoints_->writing_state();
    optimizer_step(s.lr);
    if (cfg_.model.is_moe()) finish_moe_step(s);
    checkpoints_->live_step(step + 1);
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = static_cast<double>(t.micro_batch * t.seq_len * t.grad_accum * dp_size_);
  s.tokens_per_second = tokens / s.seconds;
  s.flops_per_second =
      model_->flops_per_micro_batch() * static_cast<double>(t.grad_accum) / s.seconds;
  return s;
}

double Trainer::run_micro_batches(int64_t step, float dloss) {
  const int64_t count = cfg_.train.grad_accum;
  const GradsReady on_ready = grad_sync_->ready();
  if (pipeline_) {
    download_grads_during_backward(true);  // stages 0 and 1 reduce after the last micro-batch
    return pipeline_->train(
        step,
        [&](int micro, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
          fetch_batch(step, micro, inputs, targets);
        },
        dloss, on_ready);
  }
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < count; ++micro) {
    fetch_batch(step, micro, inputs_, targets_);
    loss_sum += model_->forward(inputs_.data(), targets_.data(), dloss);
    const bool reduce_now = grad_sync_->begin_micro_batch(micro, count);
    download_grads_during_backward(micro + 1 == count);
    model_->backward(reduce_now, on_ready);
    grad_sync_->after_backward(micro, count);
  }
  return loss_sum;
}

namespace {
constexpr int64_t kStepSums = 4;  // the loss, then GradSquares' three
}  // namespace

Tensor Trainer::step_sums(int64_t first, int64_t count) const {
  return view_of(static_cast<double*>(step_sums_.base()) + first, Shape{count}, DType::F64,
                 model_->params().device());
}

void Trainer::begin_step_sums() {
  const Device device = model_->params().device();
  if (device == Device::CPU) return;
  if (!step_sums_.base()) step_sums_ = Arena("step sums", kStepSums * sizeof(double), device);
  device_zero(step_sums_.base(), kStepSums * sizeof(double));
  model_->set_loss_total(step_sums(0, 1));  // the micro-batches' losses add up there
}

bool Trainer::read_step_sums(double& loss_sum, GradSquares& squares) {
  if (model_->params().device() == Device::CPU) return false;
  // The step's one host wait: the loss and squared sums, read back together.
  grad_squares_into(step_sums(1, 3));
  const auto* sums = static_cast<const double*>(
      step_readback_.read(step_sums_.base(), kStepSums * sizeof(double)));
  loss_sum += sums[0];
  squares = {sums[1], sums[2], sums[3]};
  model_->set_loss_total({});
  model_->rewind_uploads();
  return true;
}

void Trainer::keep_step_start(int64_t step, int64_t start_ns) {
  if (!pipeline_) return;  // for the timeline, which keeps the spans of the last steps only
  step_starts_.push_back({step, start_ns});
  if (step_starts_.size() > size_t(pipeline_->keep_steps()))
    step_starts_.erase(step_starts_.begin());
}

void Trainer::sum_tied_embedding() {
  // Tied embeddings under pipelining: the first and last stages' tables get the sum of
  // both gradients, so they stay equal.
  parallel::Communicator* ends = mesh_ ? mesh_->embedding_group() : nullptr;
  if (ends && cfg_.model.tie_embeddings) grad_sync_->sum_over(*ends, embedding_id());
}

void Trainer::clip_grads(double grad_norm) {
  if (optimizer_->on_host())  // clipped on the host (optim/host_offload.h says why)
    optimizer_->scale_grads_on_host(clip_coefficient(grad_norm, cfg_.optim.grad_clip));
  else
    clip_gradients(model_->params(), grad_norm, cfg_.optim.grad_clip, reduced_shares());
}

double Trainer::all_reduce_pp(double value) {
  if (pp_size_ > 1)
    mesh_->group(parallel::Axis::PP).all_reduce(view_of(&value, Shape{1}, DType::F64));
  return value;
}

double Trainer::all_reduce_dp(double value) {
  // Context-parallel ranks hold equal shares of the same sequences: their mean loss is the
  // sequences' mean loss.
  if (cp_size_ > 1) {
    mesh_->dp_cp().all_reduce(view_of(&value, Shape{1}, DType::F64));
    return value / cp_size_;
  }
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
          inputs.resize(size_t(t.micro_batch * t.seq_len));
          targets.resize(inputs.size());
          data_->val_samples((dp_rank_ + int64_t(micro) * dp_size_) * t.micro_batch, t.micro_batch,
                             inputs.data(), targets.data());
          keep_local_tokens(inputs);
          keep_local_tokens(targets);
        });
  } else {
    for (int64_t i = dp_rank_; i < t.eval_batches; i += dp_size_) {
      inputs_.resize(size_t(t.micro_batch * t.seq_len));
      targets_.resize(inputs_.size());
      data_->val_samples(i * t.micro_batch, t.micro_batch, inputs_.data(), targets_.data());
      keep_local_tokens(inputs_);
      keep_local_tokens(targets_);
      sum += model_->forward(inputs_.data(), targets_.data(), 0.0f);
    }
  }
  return static_cast<float>(all_reduce_dp(all_reduce_pp(sum)) /
                            static_cast<double>(t.eval_batches));
}

int64_t Trainer::last_step() const {
  const TrainConfig& t = cfg_.train;
  return t.stop_at > 0 ? std::min(t.stop_at, t.steps) : t.steps;
}

void Trainer::adapt_pipeline_group(int64_t step) {
  if (step + 1 >= last_step()) return;
  if (pipeline_ && pipeline_->schedule().splits_backward()) return adapt_zero_bubble(step);
  if (!pipeline_ || cfg_.parallel.pp_schedule != "adaptive" ||
      (step + 1) % cfg_.parallel.pp_adapt_every != 0)
    return;
  parallel::Communicator& stages = mesh_->group(parallel::Axis::PP);
  const double link =
      parallel::pp::measure_link_seconds(stages, model_->rows() * cfg_.model.d_model);
  const std::vector<double>& passes = pipeline_->pass_seconds();  // one chunk: F, B, W = 0
  const std::vector<parallel::pp::StageMeasure> measures = parallel::pp::gather_measures(
      stages, {passes[0], passes[1] + passes[2], double(model_->slot_bytes(0))});
  const double limit = cfg_.parallel.pp_memory_mb > 0
                           ? double(cfg_.parallel.pp_memory_mb) * 1024 * 1024
                           : std::numeric_limits<double>::infinity();
  parallel::pp::ScheduleSpec spec = pipeline_->schedule();
  const parallel::pp::GroupChoice choice =
      parallel::pp::choose_adaptive_group(spec, measures, link, limit);
  // Every pipeline in the job must run one schedule: data-parallel replicas measure their
  // own times and could choose differently, and then their gradient buckets would reach the
  // all-reduce in different orders. World rank 0's choice holds for all.
  spec.group = all_ranks(world_rank_ == 0 ? choice.group : 0, parallel::ReduceOp::Max);
  if (spec.group != pipeline_->schedule().group) lists_since_ = step + 1;
  pipeline_->set_schedule(spec);
  if (logs())
    spdlog::info(
        "adaptive kFkB: link {:.2f} ms, forward {:.2f} ms, backward {:.2f} ms per "
        "micro-batch: k = {} (predicted step {:.1f} ms; 1F1B {:.1f} ms)",
        link * 1e3, measures[0].forward_seconds * 1e3, measures[0].backward_seconds * 1e3,
        choice.group, choice.step_seconds * 1e3, choice.one_f_one_b_seconds * 1e3);
}

void Trainer::adapt_zero_bubble(int64_t step) {
  // After the first measured step (the first warms up), then every pp_adapt_every steps.
  if (step != 1 && (step + 1) % cfg_.parallel.pp_adapt_every != 0) return;
  parallel::Communicator& stages = mesh_->group(parallel::Axis::PP);
  const double link =
      parallel::pp::measure_link_seconds(stages, model_->rows() * cfg_.model.d_model);
  // Per stage and chunk: zb-v's first stage runs the embedding's chunk and the head's.
  // One list for every pipeline of the job (world rank 0's measures), as for adaptive kFkB:
  // the gradient buckets must reach the data-parallel reductions in one order everywhere.
  std::vector<double> costs =
      parallel::pp::gather_zero_bubble_costs(stages, pipeline_->pass_seconds(), link);
  mesh_->world().broadcast(view_of(costs.data(), Shape{int64_t(costs.size())}, DType::F64), 0);
  const parallel::pp::ScheduleSpec before = pipeline_->schedule();
  parallel::pp::ScheduleSpec spec = before;
  spec.zb_costs = costs;
  const parallel::pp::SimCosts sim = parallel::pp::zero_bubble_sim_costs(spec);
  const double old_seconds =
      parallel::pp::simulate_lists(before, parallel::pp::schedule_actions(before), sim)
          .step_seconds;
  // The lists for the measured passes hold no more slots on any stage and chunk than the
  // unit-cost ones the memory plan counts (parallel/pp/zero_bubble.cpp); the log says both.
  double held[2] = {stage_activation_bytes(before), stage_activation_bytes(spec)};
  mesh_->world().all_reduce(view_of(held, Shape{2}, DType::F64), parallel::ReduceOp::Max);
  const std::string name = parallel::pp::schedule_name(spec.kind);
  if (parallel::pp::schedule_actions(spec) != parallel::pp::schedule_actions(before))
    lists_since_ = step + 1;
  pipeline_->set_schedule(spec);
  if (logs())
    spdlog::info(
        "{} lists rebuilt for the measured passes (stage 0's first chunk: forward {:.2f} ms, B "
        "{:.2f} ms, W {:.2f} ms; link {:.2f} ms): predicted step {:.1f} ms (the previous "
        "lists: {:.1f} ms); activations {} on the fullest stage (the previous lists: {})",
        name, costs[0] * 1e3, costs[1] * 1e3, costs[2] * 1e3, link * 1e3,
        parallel::pp::simulate(spec, sim).step_seconds * 1e3, old_seconds * 1e3,
        format_bytes(size_t(held[1])), format_bytes(size_t(held[0])));
}

double Trainer::stage_activation_bytes(const parallel::pp::ScheduleSpec& spec) const {
  const std::vector<parallel::pp::Action> actions = parallel::pp::stage_actions(spec, pp_rank_);
  double bytes = 0;
  for (int c = 0; c < model_->chunks(); ++c)
    bytes += double(parallel::pp::peak_in_flight(actions, c)) * double(model_->slot_bytes(c));
  return bytes;
}

void Trainer::finish_moe_step(StepStats& s) {
  const MoeStats mine = model_->take_moe_stats();
  const std::vector<int64_t> layers = moe_layer_indices(cfg_.model);
  const size_t L = layers.size(), E = size_t(cfg_.model.n_experts);
  // [counts (L x E), dropped (L), aux, seq_aux, z] over every MoE layer of the model; each
  // rank fills the layers it holds, and ranks hold disjoint tokens, so the sum is the job's.
  std::vector<double> all(L * E + L + 3, 0.0);
  for (size_t i = 0; i < mine.layers.size(); ++i) {
    const size_t at =
        size_t(std::find(layers.begin(), layers.end(), mine.layers[i]) - layers.begin());
    std::copy_n(mine.counts.begin() + long(i * E), E, all.begin() + long(at * E));
    all[L * E + at] = mine.dropped[i];
  }
  all[L * E + L] = mine.aux;
  all[L * E + L + 1] = mine.seq_aux;
  all[L * E + L + 2] = mine.z;
  if (mesh_) mesh_->world().all_reduce(view_of(all.data(), Shape{int64_t(all.size())}, DType::F64));
  const double micro_batches = double(cfg_.train.grad_accum * dp_size_);
  s.moe_aux = all[L * E + L] / micro_batches;
  s.moe_seq_aux = all[L * E + L + 1] / micro_batches;
  s.moe_z = all[L * E + L + 2] / micro_batches;
  std::vector<double> held;  // the counts of this rank's layers, for their bias update
  for (size_t i = 0; i < L; ++i) {
    const auto first = all.begin() + long(i * E), last = first + long(E);
    const double picks = std::accumulate(first, last, 0.0);
    s.moe_layers.push_back({layers[i], *std::min_element(first, last),
                            *std::max_element(first, last), picks / double(E),
                            picks > 0 ? all[L * E + i] / picks : 0.0,
                            std::vector<double>(first, last)});
    if (std::find(mine.layers.begin(), mine.layers.end(), layers[i]) != mine.layers.end())
      held.insert(held.end(), first, last);
  }
  if (cfg_.model.moe.bias_update_rate > 0) update_expert_bias(held);
  // ZeRO-3: back to this rank's shares, the bias's other shares (just moved here too) as well.
  if (zero_stage() == 3) grad_sync_->gather_updated_params();
}

int Trainer::all_ranks(int value, parallel::ReduceOp op) {
  if (mesh_) mesh_->world().all_reduce(view_of(&value, Shape{1}, DType::I32), op);
  return value;
}

}  // namespace pentad
