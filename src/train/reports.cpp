// The Trainer's reports: the plan it prints before training (data, model, memory), the
// step and eval lines and metrics.jsonl (with its TensorBoard events), and the files asked for on
// the command line (the communication log, weight and gradient dumps, the pipeline timeline). None
// of them changes what is trained.
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/sha256.h"
#include "core/device_memory.h"
#include "core/npy.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {

namespace pp = parallel::pp;

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
  spdlog::info("{}", memory_plan());
  if (model_->params().device() == Device::CUDA)
    spdlog::info("device: {}", cuda_device_description());
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
    j["blocked_seconds"] = checkpoint_blocked_seconds() - blocked_reported_;
    blocked_reported_ = checkpoint_blocked_seconds();
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

void Trainer::report_checkpoints(double blocked_seconds, double final_flush_seconds) {
  write_metrics(nlohmann::json{{"checkpoint_saves", saves_},
                               {"checkpoint_blocked_seconds", blocked_seconds},
                               {"checkpoint_final_flush_seconds", final_flush_seconds}});
  spdlog::info(
      "checkpoints: {} saves, training blocked {:.3f} s in all ({}), final flush {:.3f} s, {} "
      "files written over recycled ones",
      saves_, blocked_seconds, cfg_.train.async_save ? "asynchronous" : "synchronous",
      final_flush_seconds, saver_.recycled_files());
}

void Trainer::report_saver_time(int64_t step, const ckpt::AsyncSaver::Timings& t) {
  // The background thread's wall and CPU seconds for this rank's save: the CPU time is what
  // it took from the compute threads where they share the cores (bench/checkpoint_bench.py).
  write_metrics(nlohmann::json{{"saved_step", step},
                               {"saver_copy_seconds", t.copy_seconds},
                               {"saver_copy_cpu_seconds", t.copy_cpu_seconds},
                               {"saver_write_seconds", t.write_seconds},
                               {"saver_write_cpu_seconds", t.write_cpu_seconds}});
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
  // The ranks that would write each shard to a checkpoint (writes()) dump it.
  std::filesystem::create_directories(dir);
  const ParamStore& p = model_->params();
  const int tp_rank = model_->tp().rank();
  nlohmann::json shards = nlohmann::json::array();
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const ParamSpec& spec = p.spec(id);
    if (spec.pipeline_copy || !writes(spec)) continue;  // the first stage writes the original
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

std::string Trainer::memory_plan() const {
  const ParamStore& p = model_->params();
  // ZeRO: AdamW keeps m and v for this rank's shares (S elements of the arena's N); stage 1
  // adds the reduced shares (S) to the full gradients (N), stage 2 holds the full gradients
  // only bucket by bucket while backward writes them (a bucket's pages go once reduced),
  // plus the reduced shares (S; later micro-batches add them into each bucket before its
  // reduce-scatter writes them back).
  const size_t shard = size_t(optimizer_->shard().numel) * sizeof(float);
  // Offloaded to NVMe: the streaming buffers (three sub-groups of m and v) in memory.
  const NvmeState* nvme = optimizer_->nvme();
  // ZeRO-3: resident are this rank's shares (what the sparse arena backs) and the units whole
  // at once, each in a buffer of its own: the stretch computing and the next one prefetched,
  // per reducer (with MoE a layer's dense unit and its experts' are whole together), counted
  // by a dry run of the hooks through one forward and backward. With the shares on NVMe the
  // arena backs none of them, and each reducer's next share is being read ahead.
  const bool nvme_params = optimizer_->params_offloaded();
  GatheredPeak gathered;
  size_t read_ahead = 0;
  if (zero_stage() == 3) {
    gathered = zero3_gathered_peak(zero_reducers(), p, model_->stretches(),
                                   int(cfg_.parallel.zero_live_units));
    for (const parallel::GradReducer* r : zero_reducers()) {
      int64_t most = 0;
      for (int b = 0; b < r->buckets_count(); ++b) most = std::max(most, r->bucket_share(b));
      read_ahead += size_t(most) * sizeof(float);
    }
  }
  const bool on_device = p.device() == Device::CUDA;
  // A gathered unit's values, and its compute copy when the model computes in bf16.
  const size_t per_value =
      sizeof(float) + (p.compute_dtype() == DType::F32 ? 0 : dtype_bytes(p.compute_dtype()));
  const size_t params = zero_stage() != 3
                            ? p.bytes() + p.compute_copy_bytes()
                            : size_t(gathered.whole) * per_value + (nvme_params ? read_ahead : 0) +
                                  p.committed_param_bytes();
  // Updated on the host (CUDA, offload "cpu" or "nvme"): none on the device (counted in the
  // text below).
  const size_t optim = optimizer_->on_host() ? 0 : nvme ? nvme->host_buffer_bytes() : 2 * shard;
  // Stages 2 and 3 also hold up to GradReducer::kInFlight buckets of the full gradients (per
  // reducer: the experts' too) while their reductions are pending (README's "2 buckets").
  size_t pending = 0;
  if (zero_stage() >= 2)
    for (const parallel::GradReducer* r : {reducer_.get(), expert_reducer_.get()})
      if (r)
        pending += parallel::GradReducer::kInFlight * size_t(r->largest_bucket()) * sizeof(float);
  const size_t grads = zero_stage() == 0   ? p.bytes()
                       : zero_stage() == 1 ? p.bytes() + shard
                                           : std::min(p.bytes(), pending) + shard;
  std::string zero_text;
  if (zero_stage() > 0)
    zero_text = fmt::format(
        " | ZeRO-{} over dp x cp = {}{}: this rank's shares {} of {} values (AdamW m, v and the "
        "reduced gradients){}",
        zero_stage(), dp_size_ * cp_size_,
        expert_reducer_
            ? fmt::format(", the routed experts over edp = {}", mesh_->degree(parallel::Axis::EDP))
            : "",
        optimizer_->shard().numel, p.numel(),
        zero_stage() >= 2 ? "; the full gradients live only bucket by bucket during backward" : "");
  if (optimizer_->on_host() && !nvme)
    zero_text += fmt::format(
        " | AdamW state in host memory: {} (m and v) and {} of page-locked staging; each step "
        "streams the {} values' parameters and gradients through the host and back",
        format_bytes(2 * shard), format_bytes(optimizer_->host_staging_bytes()),
        optimizer_->shard().numel);
  if (zero_stage() == 3 && !nvme_params)
    zero_text += fmt::format(
        "; parameters: the {} of this rank's shares stay, each layer is gathered into a buffer "
        "of its own while it computes and dropped after",
        format_bytes(shard));
  if (nvme_params)
    zero_text += fmt::format(
        "; parameters: none resident, the {} of this rank's shares live on NVMe, each layer's "
        "is read back{} and the layer gathered while the one before computes, all dropped after",
        format_bytes(shard), on_device ? " through page-locked staging, uploaded," : "");
  if (nvme)
    zero_text += fmt::format(
        " | AdamW state on NVMe{}: {} in {}{} (in {}memory: 3 sub-groups of {}, {}{})",
        nvme_params ? " with the parameter shares" : "", format_bytes(nvme->file_bytes()),
        nvme->path(), nvme->direct() ? ", direct I/O" : "", optimizer_->on_host() ? "host " : "",
        nvme_params ? "p, m and v" : "m and v", format_bytes(nvme->host_buffer_bytes()),
        optimizer_->on_host()
            ? fmt::format(", and {} of page-locked staging; each step streams the {} values' "
                          "{}",
                          format_bytes(optimizer_->host_staging_bytes()), optimizer_->shard().numel,
                          nvme_params ? "gradients to the host, where their parameters are "
                                        "updated in the file"
                                      : "parameters and gradients through the host and back")
            : "");
  // The second set of parameters and moments (swap), or the staging buffer (copy).
  const size_t snapshot = p.has_spare() ? p.bytes() + 2 * shard : saver_.staging_bytes();
  size_t acts = model_->activation_bytes() + model_->cp().scratch_bytes();
  std::string in_flight;
  if (cp_size_ > 1)
    in_flight = fmt::format(
        "; {} tokens of each sequence here (cp {} {}), with {} of "
        "context-parallel buffers",
        cfg_.train.seq_len / cp_size_, cp_size_, cfg_.parallel.cp_impl,
        format_bytes(model_->cp().scratch_bytes()));
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
  // MoE: the routed experts held here, and the dispatch buffers, which are sized at each
  // forward by the routing (counted here at the estimate's worst case).
  std::string experts, dispatch_text;
  size_t dispatch = 0;
  if (cfg_.model.is_moe()) {
    int64_t expert_values = 0;
    for (const ParamSpec& spec : p.specs())
      if (spec.expert) expert_values += spec.local_shape.numel();
    experts = fmt::format(", {} in routed experts", expert_values);
    dispatch = size_t(
        estimate_memory(cfg_, mesh_ ? mesh_->config() : parallel::MeshConfig{}, pp_rank_).dispatch);
    dispatch_text = fmt::format(" | MoE dispatch buffers up to {} (worst case, sized as routed)",
                                format_bytes(dispatch));
  }
  return fmt::format(
      "memory plan (this rank, {} {}): parameters {} ({} values{}{}) | gradients {} | AdamW state "
      "{} | activations {} (micro-batch {} x {}, recompute {}{}){}{}{} | total {}",
      cfg_.train.device, cfg_.train.precision, format_bytes(params), p.numel(),
      p.compute_copy_bytes() ? ", f32 master + bf16 copy" : "", experts, format_bytes(grads),
      format_bytes(optim), format_bytes(acts), cfg_.train.micro_batch, cfg_.train.seq_len,
      cfg_.model.recompute ? "on" : "off", in_flight, dispatch_text, zero_text,
      snapshot ? fmt::format(" | checkpoint snapshot {} ({})", format_bytes(snapshot),
                             p.has_spare() ? "swap: a second set of the state" : "copy: staging")
               : "",
      format_bytes(params + grads + optim + acts + dispatch + snapshot));
}

double Trainer::write_timeline(const std::string& path) {
  if (!pipeline_) return -1.0;
  // This rank's spans as rows of 7 int64: kind, micro, chunk, step, start, end, CPU time;
  // step starts as kind -1.
  constexpr int64_t kRow = 7;
  std::vector<int64_t> rows;
  for (const auto& [step, start] : step_starts_)
    rows.insert(rows.end(), {-1, 0, 0, step, start, start, 0});
  for (const pp::Span& s : pipeline_->spans())
    rows.insert(rows.end(),
                {int64_t(s.kind), s.micro, s.chunk, s.step, s.start_ns, s.end_ns, s.cpu_ns});
  // Gathered to world rank 0; int64 values travel as pairs of int32 (the same bytes).
  auto words = [](int64_t* data, int64_t count) {
    return view_of(data, Shape{2 * count}, DType::I32);
  };
  parallel::Communicator& world = mesh_->world();
  const int n = world.size();
  int64_t count = int64_t(rows.size());
  std::vector<int64_t> counts(static_cast<size_t>(n));
  world.all_gather(words(counts.data(), n), words(&count, 1));
  std::vector<int64_t> send_counts(size_t(n), 0), recv_counts(size_t(n), 0);
  send_counts[0] = 2 * count;
  int64_t total = 0;
  if (world_rank_ == 0)
    for (int r = 0; r < n; ++r) recv_counts[size_t(r)] = 2 * counts[size_t(r)];
  for (int64_t c : recv_counts) total += c / 2;
  std::vector<int64_t> gathered(size_t(std::max<int64_t>(total, 1)));
  rows.resize(std::max<size_t>(rows.size(), 1));
  world.all_to_all_v(words(gathered.data(), int64_t(gathered.size())), recv_counts,
                     words(rows.data(), int64_t(rows.size())), send_counts);
  // Spans are wall time: when the ranks' threads outnumber the cores, a rank that waits for
  // a core looks idle, and the measured bubble counts that wait too.
  const NodeShare node = node_share();
  if (world_rank_ != 0) return 0.0;

  nlohmann::json events = nlohmann::json::array();
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < total; i += kRow) origin = std::min(origin, gathered[size_t(i + 4)]);
  // Per step: the earliest start over ranks, the latest pass end, and each rank's busy time.
  struct StepWindow {
    int64_t start = std::numeric_limits<int64_t>::max(), end = 0;
    std::map<int, double> busy;
    double cpu = 0;  // CPU time in passes, all ranks
  };
  std::map<int64_t, StepWindow> windows;
  // Each stage's CPU time a forward and a backward pass (one micro-batch through one chunk),
  // over the steps after the first: the schedule replayed with these is the bubble of the
  // stages' own compute, which the clock cannot show when ranks wait for cores.
  const int stages = mesh_->config().pp;
  std::vector<double> pass_cpu[2] = {std::vector<double>(size_t(stages)),
                                     std::vector<double>(size_t(stages))};
  std::vector<int64_t> passes[2] = {std::vector<int64_t>(size_t(stages)),
                                    std::vector<int64_t>(size_t(stages))};
  std::set<int64_t> recorded;
  for (int64_t i = 0; i < total; i += kRow) recorded.insert(gathered[size_t(i + 3)]);
  const int64_t warm_up = recorded.size() > 1 ? *recorded.begin() : -1;  // left out
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    const parallel::MeshCoords x = parallel::mesh_coords(mesh_->config(), r);
    events.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", 0},
         {"tid", r},
         {"args",
          {{"name", fmt::format("rank {} (pp {} dp {} tp {})", r, x[size_t(parallel::Axis::PP)],
                                x[size_t(parallel::Axis::DP)], x[size_t(parallel::Axis::TP)])}}}});
    for (int64_t i = offset; i < offset + counts[size_t(r)]; i += kRow) {
      const int64_t* row = &gathered[size_t(i)];
      StepWindow& w = windows[row[3]];
      if (row[0] < 0) {
        w.start = std::min(w.start, row[4]);
        continue;
      }
      const auto kind = pp::Span::Kind(row[0]);
      const bool pass = kind == pp::Span::Forward || kind == pp::Span::Backward;
      if (pass) {
        w.end = std::max(w.end, row[5]);
        w.busy[r] += double(row[5] - row[4]);
        w.cpu += double(row[6]);
        if (row[3] != warm_up) {
          const int backward = kind == pp::Span::Backward;
          const size_t stage = size_t(x[size_t(parallel::Axis::PP)]);
          pass_cpu[backward][stage] += double(row[6]) * 1e-9;
          ++passes[backward][stage];
        }
      }
      const std::string name = pass ? fmt::format("{}{}{}", kind == pp::Span::Forward ? "F" : "B",
                                                  row[1], row[2] ? fmt::format(".{}", row[2]) : "")
                                    : pp::span_name(kind);
      events.push_back({{"name", name},
                        {"cat", pp::span_name(kind)},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", double(row[4] - origin) * 1e-3},
                        {"dur", double(row[5] - row[4]) * 1e-3},
                        {"args",
                         {{"step", row[3] + 1},
                          {"micro_batch", row[1]},
                          {"chunk", row[2]},
                          {"cpu_ms", double(row[6]) * 1e-6}}}});
    }
    offset += counts[size_t(r)];
  }
  // Bubble: 1 - mean busy / window, averaged over the recorded steps after the first
  // (warm-up). Assumes the ranks' steady clocks agree, as they do on one machine.
  // The CPU-time bubble counts the cores' time instead: 1 - CPU time in passes / (cores the
  // ranks can use x window). It is the larger one when ranks wait for a core (each other's or
  // another program's) in the middle of a pass.
  const double core_slots =
      double(std::min(node.threads, node.cores)) * std::max(1, n / node.ranks);
  double bubble_sum = 0.0, cpu_bubble_sum = 0.0;
  int steps = 0;
  for (auto it = windows.begin(); it != windows.end(); ++it) {
    if (it == windows.begin() && windows.size() > 1) continue;
    const StepWindow& w = it->second;
    if (w.end <= w.start) continue;
    double busy = 0.0;
    for (const auto& [rank, b] : w.busy) busy += b;
    bubble_sum += 1.0 - busy / (double(n) * double(w.end - w.start));
    cpu_bubble_sum += std::max(0.0, 1.0 - w.cpu / (core_slots * double(w.end - w.start)));
    ++steps;
  }
  const double bubble = steps ? bubble_sum / steps : 0.0;
  const double cpu_bubble = steps ? cpu_bubble_sum / steps : 0.0;
  const pp::ScheduleSpec& spec = pipeline_->schedule();
  // A pass's CPU time over the threads a rank computes with: its time on cores of its own.
  const double rank_threads = std::max(1.0, double(node.threads) / std::max(1, node.ranks));
  pp::SimCosts costs;
  for (int b = 0; b < 2; ++b)
    for (int st = 0; st < stages; ++st) {
      const double mean = passes[b][size_t(st)] ? pass_cpu[b][size_t(st)] /
                                                      double(passes[b][size_t(st)]) / rank_threads
                                                : 0.0;
      (b ? costs.backward_seconds : costs.forward_seconds).push_back(mean);
    }
  const pp::SimResult replay = pp::simulate(spec, costs);
  const double compute_bubble = replay.deadlock ? -1.0 : replay.bubble_fraction();
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"schedule", cfg_.parallel.pp_schedule},
                          {"stages", spec.stages},
                          {"micro_batches", spec.micro_batches},
                          {"virtual_stages", spec.virtual_stages},
                          {"group", spec.group},
                          {"measured_bubble_fraction", bubble},
                          {"ideal_bubble_fraction", pp::ideal_bubble_fraction(spec)},
                          {"cpu_time_bubble_fraction", cpu_bubble},
                          {"compute_time_bubble_fraction", compute_bubble},
                          {"threads_on_node", node.threads},
                          {"cores_on_node", node.cores}}}};
  std::ofstream out(path);
  if (!out) fail("cannot write the pipeline trace {}", path);
  out << doc.dump();
  const std::string schedule =
      fmt::format("{} p={} m={} v={}{}", cfg_.parallel.pp_schedule, spec.stages, spec.micro_batches,
                  spec.virtual_stages,
                  spec.kind == pp::ScheduleKind::KFKB ? fmt::format(" k={}", spec.group) : "");
  if (node.threads <= node.cores)
    spdlog::info(
        "pipeline trace: {} ({} steps) | bubble measured {:.3f} (wall time; {:.3f} by CPU "
        "time, {:.3f} from the stages' own compute time), ideal {:.3f} ({})",
        path, steps, bubble, cpu_bubble, compute_bubble, pp::ideal_bubble_fraction(spec), schedule);
  else  // the clock measures the waits for a core as much as the schedule
    spdlog::info(
        "pipeline trace: {} ({} steps) | bubble {:.3f} from the stages' own compute time (the "
        "schedule replayed with each stage's CPU time a pass), ideal {:.3f} ({}) | not "
        "measured by the clock: {} ranks ({} compute threads) share {} core{} on this machine, "
        "so wall and CPU time count waits for a core, not only for other stages",
        path, steps, compute_bubble, pp::ideal_bubble_fraction(spec), schedule, node.ranks,
        node.threads, node.cores, node.cores == 1 ? "" : "s");
  return bubble;
}

}  // namespace pentad
