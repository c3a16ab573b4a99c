// The Trainer's reports: the plan it prints before training (data, model; the memory plan is
// train/memory_report.cpp), the step and eval lines and metrics.jsonl (with its TensorBoard
// events), and the files asked for on the command line (the communication log, weight and
// gradient dumps; the pipeline timeline is train/timeline.cpp). None of them changes what is
// trained.
#include <fmt/ranges.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint/sha256.h"
#include "core/device_memory.h"
#include "core/npy.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "kernels/op_profile.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {

void Trainer::log_plan() const {
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
  // The whole model's, not this rank's (a pipeline stage or an expert group holds a part).
  const int64_t parameters = model_parameters(cfg_);
  spdlog::info("model: {} with {} layers, width {}, {} heads ({} kv), vocabulary {}: {} parameters",
               cfg_.model.family == ModelFamily::GPT2 ? "gpt2" : "llama", cfg_.model.n_layer,
               cfg_.model.d_model, cfg_.model.n_head, cfg_.model.kv_heads(), cfg_.model.vocab_size,
               parameters);
  if (pipeline_) log_pipeline_cut();
  spdlog::info("{}", memory_plan());
  if (model_->params().device() == Device::CUDA)
    spdlog::info("device: {}", cuda_device_description());
}

void Trainer::log_pipeline_cut() const {
  const int stages = mesh_->degree(parallel::Axis::PP);
  const std::vector<int64_t> cut = pipeline_chunk_layers(cfg_, stages);
  if (cfg_.parallel.pp_layout == "balanced") {
    spdlog::info(
        "pipeline chunks of {} layers (parallel.pp_layout = \"balanced\": by each layer's and "
        "the head's FLOPs, the last chunk also running the head and the loss)",
        fmt::join(cut, ", "));
    return;
  }
  if (!cfg_.parallel.pp_layout.empty()) return;
  // An even split whose head chunk outweighs the rest: say what "balanced" would do.
  Config balanced = cfg_;
  balanced.parallel.pp_layout = "balanced";
  const std::vector<int64_t> better = pipeline_chunk_layers(balanced, stages);
  const parallel::pp::LayerCosts costs = pipeline_layer_costs(cfg_);
  auto costliest = [&](const std::vector<int64_t>& layers) {
    const std::vector<double> c = parallel::pp::chunk_costs(costs, layers);
    return *std::max_element(c.begin(), c.end());
  };
  const double excess = costliest(cut) / costliest(better) - 1;
  if (excess > 0.05)
    spdlog::info(
        "pipeline chunks of {} layers: the costliest has {:.0f}% more FLOPs than it would with "
        "parallel.pp_layout = \"balanced\" ({} layers; the last chunk also runs the head)",
        fmt::join(cut, ", "), 100 * excess, fmt::join(better, ", "));
}

void Trainer::open_run_files() {
  const TrainConfig& t = cfg_.train;
  set_throughput_basis();
  if (!logs()) return;
  metrics_.open(t.out_dir, !t.resume.empty(), start_step_, t.tensorboard);
  std::ofstream recipe(std::filesystem::path(t.out_dir) / "recipe.toml");
  recipe << recipe_to_toml(cfg_);
  keep_tokenizer();
  spdlog::info(
      "throughput: {:.4g} model FLOPs a token (forward and backward, as pentad plan counts "
      "them), over {} device{}; {}",
      flops_per_token_, devices_, devices_ == 1 ? "" : "s", peak_note_);
}

void Trainer::set_throughput_basis() {
  flops_per_token_ = model_flops_per_token(cfg_.model, double(cfg_.train.seq_len));
  devices_ = mesh_ ? mesh_->world_size() : 1;
  if (model_->params().device() == Device::CUDA) {
    const std::string device = cuda_device_description();
    peak_flops_per_device_ = gpu_peak_flops(device);
    // Against the bf16 tensor-core peak whatever the precision, as Megatron and torchtitan
    // report it: an fp32 run's MFU reads low, and the note says so.
    peak_note_ = peak_flops_per_device_ > 0
                     ? fmt::format("MFU against the GPU's dense bf16 peak, {:.1f} TFLOP/s ({}){}",
                                   peak_flops_per_device_ / 1e12, device,
                                   cfg_.train.precision == "bf16"
                                       ? ""
                                       : "; this run computes in fp32, below that peak")
                     : fmt::format("MFU n/a (no datasheet peak known for {})", device);
    return;
  }
  // A CPU rank's peak: the machine's fastest measured GEMM (every core) over the ranks on it,
  // as `pentad plan` takes it (Machine::rank_peak_flops).
  const NodeShare node = node_share();
  const std::string path = default_calibration_path();
  if (!std::filesystem::exists(path)) {
    peak_note_ = "MFU n/a (no calibration: run pentad plan --calibrate)";
    return;
  }
  try {
    const Calibration calibration = Calibration::read(path);
    peak_flops_per_device_ = this_machine(calibration, node.ranks).machine.rank_peak_flops();
    peak_note_ = fmt::format(
        "MFU against this machine's measured peak: its fastest GEMM over the {} rank{} on it, "
        "{:.3g} GFLOP/s a rank ({}, {} cores; {})",
        node.ranks, node.ranks == 1 ? "" : "s", peak_flops_per_device_ / 1e9, calibration.machine,
        calibration.cores, path);
  } catch (const Error& e) {
    peak_note_ = fmt::format("MFU n/a (the calibration cannot be read: {})", e.what());
  }
}

void Trainer::keep_tokenizer() {
  namespace fs = std::filesystem;
  const std::string path = data::run_tokenizer(cfg_.data, cfg_.model.vocab_size);
  if (path.empty()) return;  // random tokens, or token files without data.tokenizer
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    spdlog::warn("tokenizer: {} cannot be read ({}): checkpoints will carry no tokenizer", path,
                 std::strerror(errno));
    return;
  }
  auto bytes = std::make_shared<std::string>(std::istreambuf_iterator<char>(in),
                                             std::istreambuf_iterator<char>());
  tokenizer_.file = data::Tokenizer::file_name_for(*bytes);
  tokenizer_.sha256 = ckpt::sha256_hex(*bytes);
  tokenizer_.bytes = std::move(bytes);
  // A copy with the run, and its hash in sha256sum's format (`sha256sum -c` checks it).
  const fs::path copy = fs::path(cfg_.train.out_dir) / tokenizer_.file;
  std::ofstream(copy, std::ios::binary | std::ios::trunc) << *tokenizer_.bytes;
  std::ofstream(copy.string() + ".sha256") << tokenizer_.sha256 << "  " << tokenizer_.file << "\n";
  spdlog::info("tokenizer: {} (sha256 {}), copied to {} and carried by every checkpoint", path,
               tokenizer_.sha256, copy.string());
}

void Trainer::write_metrics(const nlohmann::json& row) {
  if (!logs()) return;
  metrics_.write(row);
}

void Trainer::report_step(const StepStats& s, std::chrono::steady_clock::time_point run_start,
                          int64_t last) {
  const TrainConfig& t = cfg_.train;
  const int64_t step = s.step;
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
  if (s.skipped) j["skipped"] = true;  // not finite: nothing updated (JSON writes NaN as null)
  std::string moe_line;
  if (cfg_.model.is_moe()) {
    j["moe_aux_loss"] = s.moe_aux;
    j["moe_seq_aux_loss"] = s.moe_seq_aux;
    j["moe_z_loss"] = s.moe_z;
    nlohmann::json layers = nlohmann::json::array();
    double worst = 0.0, dropped = 0.0;
    for (const StepStats::MoeLayer& m : s.moe_layers) {
      layers.push_back({{"layer", m.layer},
                        {"tokens_min", m.min},
                        {"tokens_max", m.max},
                        {"tokens_mean", m.mean},
                        {"dropped_fraction", m.dropped},
                        {"tokens", m.tokens}});
      if (m.mean > 0) worst = std::max(worst, m.max / m.mean);
      dropped = std::max(dropped, m.dropped);
    }
    j["moe_layers"] = layers;
    moe_line = fmt::format(" | aux {:.4f} z {:.4f} | max/mean load {:.2f} | dropped {:.1f}%",
                           s.moe_aux + s.moe_seq_aux, s.moe_z, worst, 100.0 * dropped);
  }
  if (t.save_every > 0) {  // this step's time blocked by checkpoints (its save's start included)
    j["blocked_seconds"] = checkpoints_->blocked_seconds() - blocked_reported_;
    blocked_reported_ = checkpoints_->blocked_seconds();
  }
  // Megatron's and torchtitan's figures: tokens/s of the job and per device, model FLOP/s
  // per device (the global batch's, counted as `pentad plan` counts them, over every rank) and
  // MFU against the device's peak. flops_per_second stays this rank's share, as it was.
  const double device_tokens = s.tokens_per_second / devices_;
  const double device_flops = device_tokens * flops_per_token_;
  j["tokens_per_second_per_device"] = device_tokens;
  j["flops_per_second_per_device"] = device_flops;
  if (peak_flops_per_device_ > 0) j["mfu"] = device_flops / peak_flops_per_device_;
  write_metrics(j);
  if (peak_flops_per_device_ > 0 && device_flops > peak_flops_per_device_ && !above_peak_said_ &&
      logs()) {
    // Above 100%: the peak is wrong, not the step (a calibration timed on busy cores, or on
    // other hardware under the same name).
    spdlog::warn(
        "step {}: {:.3g} GFLOP/s a device is above the peak MFU is against ({:.3g} GFLOP/s: {}); "
        "that peak is too low{}",
        step + 1, device_flops / 1e9, peak_flops_per_device_ / 1e9, peak_note_,
        model_->params().device() == Device::CUDA
            ? ""
            : ": rerun `pentad plan --calibrate` on this machine while it is idle");
    above_peak_said_ = true;
  }
  if (t.log_every > 0 && ((step + 1) % t.log_every == 0 || step == start_step_ || step + 1 == last))
    spdlog::info(
        "step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tokens/s ({:.0f} per "
        "device) | {:.3g} TFLOP/s per device | MFU {}{}",
        step + 1, t.steps, s.loss, s.lr, s.grad_norm, s.tokens_per_second, device_tokens,
        device_flops / 1e12,
        peak_flops_per_device_ > 0
            ? fmt::format("{:.1f}%", 100 * device_flops / peak_flops_per_device_)
            : std::string("n/a"),
        moe_line);
}

void Trainer::report_eval(int64_t step, float loss) {
  write_metrics(nlohmann::json{{"step", step + 1}, {"eval_loss", loss}});
  spdlog::info("step {:>5}/{} | eval loss {:.4f}", step + 1, cfg_.train.steps, loss);
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

void Trainer::dump_weights(const std::string& dir) {
  whole_parameters(true);  // ZeRO-3: the writers need them whole
  dump_shards(dir, false);
  whole_parameters(false);
}

void Trainer::dump_shards(const std::string& dir, bool grads) const {
  // The ranks that would write each shard to a checkpoint (CheckpointManager::writes()) dump it.
  std::filesystem::create_directories(dir);
  const ParamStore& p = model_->params();
  const int tp_rank = model_->tp().rank();
  nlohmann::json shards = nlohmann::json::array();
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    // (A pipeline copy's original is written by the first stage.)
    if (spec.pipeline_copy || !checkpoints_->writes(spec)) continue;
    const std::string file = fmt::format("{}.r{}.npy", spec.name, world_rank_);
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
                      {"shard_start", spec.shard_start},
                      {"shard_dim2", spec.shard_dim2},
                      {"shard_start2", spec.shard_start2}});
  }
  if (!shards.empty())
    std::ofstream(fmt::format("{}/shards.pp{}.tp{}.r{}.json", dir, pp_rank_, tp_rank, world_rank_))
        << shards.dump(1);
}

void Trainer::write_op_profile() const {
  const kernels::op_profile::Profile profile = kernels::op_profile::collect();
  std::filesystem::path path = op_profile_path_;
  if (devices_ > 1)
    path.replace_filename(
        fmt::format("{}.rank{}{}", path.stem().string(), world_rank_, path.extension().string()));
  std::ofstream out(path);
  out << kernels::op_profile::to_json(profile, peak_flops_per_device_) << "\n";
  out.close();
  if (!out) fail("--op-profile: cannot write {}: {}", path.string(), std::strerror(errno));
  if (logs())
    spdlog::info("{}(rank 0; every rank's: {})",
                 kernels::op_profile::report(profile, peak_flops_per_device_),
                 devices_ > 1 ? op_profile_path_ + " with .rank<r>" : path.string());
}

}  // namespace pentad
