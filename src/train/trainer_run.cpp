// The Trainer's whole run (Trainer::run): the plan, a resume or init_from, the steps with
// their saves, evaluations and samples, and the end-of-run summary.
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "kernels/op_profile.h"
#include "parallel/activity.h"
#include "train/sampler.h"
#include "train/survivor_save.h"
#include "train/trainer.h"

namespace pentad {

namespace {

// Says, every `every` seconds, that a step is still running: the first step of a long
// sequence (recipes/llama-longctx.toml) takes tens of seconds on a few cores, and a
// terminal silent that long looks hung. A thread of its own, on the rank that logs.
class StepProgress {
 public:
  StepProgress(double every_s, int64_t last) : every_(every_s), last_(last) {
    if (every_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~StepProgress() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  StepProgress(const StepProgress&) = delete;
  StepProgress& operator=(const StepProgress&) = delete;
  void begin(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = step;
    since_ = std::chrono::steady_clock::now();
  }
  void done(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = -1;
    previous_ = seconds;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(every_), [this] { return stop_; })) {
      if (step_ < 0) continue;
      const double running =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
      if (running < every_) continue;
      spdlog::info("step {:>5}/{}: still running after {:.0f} s{}", step_ + 1, last_, running,
                   previous_ > 0 ? fmt::format(" (the step before took {:.1f} s)", previous_)
                                 : std::string(" (the first step: nothing to compare yet)"));
    }
  }

  double every_;
  int64_t last_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t step_ = -1;
  double previous_ = 0;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

}  // namespace

std::string Trainer::job_tag() {
  // World rank 0's clock at this call, in microseconds, on every rank.
  double us = 0;
  if (world_rank_ == 0)
    us = std::round(std::chrono::duration<double, std::micro>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count());
  if (mesh_) mesh_->world().all_reduce(view_of(&us, Shape{1}, DType::F64));
  return fmt::format("{:x}", int64_t(us));
}

void Trainer::run() {
  const TrainConfig& t = cfg_.train;
  log_plan();
  const bool eval = t.eval_every > 0 && data_->val_windows() > 0;
  // Checkpoints are loaded and checked before anything is written: a refused resume
  // leaves the run's files as they were.
  if (!t.resume.empty() && !t.init_from.empty())
    fail(
        "train.init_from = {} and --resume {} are both set: resume continues a run, "
        "init_from starts a new one from another's weights; keep one",
        t.init_from, t.resume);
  if (!t.resume.empty()) start_step_ = checkpoints_->resume(t.resume);
  if (!t.init_from.empty()) checkpoints_->init_from(t.init_from);
  if (t.save_every > 0) checkpoints_->check_roots(start_step_);
  check_sample_layout(cfg_, mesh_);
  std::unique_ptr<TrainingSampler> sampler;
  if (t.sample_every > 0 && logs()) sampler = std::make_unique<TrainingSampler>(cfg_);
  open_run_files();
  const int64_t last = last_step();
  if (start_step_ >= last && logs())
    spdlog::info(
        "nothing to train: the run resumed at step {}, and it stops at step {} (train.steps{}); "
        "raise train.steps to train further",
        start_step_, last, t.stop_at > 0 && t.stop_at < t.steps ? ", train.stop_at" : "");
  const auto run_start = std::chrono::steady_clock::now();
  started_ = true;
  parallel::activity_run_started(start_step_);  // the fault monitor starts reporting
  blocked_reported_ = checkpoints_->blocked_seconds();
  StepProgress progress(logs() ? 10.0 : 0.0, last);
  // SIGTERM meanwhile (mpirun after a rank died; pentad launch ending the job): this rank's
  // state written for a restart to take (survivor_save.h), tagged with this job's start.
  std::optional<SurvivorSave> survivors;
  if (checkpoints_->survivors_possible()) {
    checkpoints_->count_survivor_tensors();
    checkpoints_->live_step(start_step_);
    survivors.emplace([this, tag = job_tag()] { checkpoints_->write_survivor_state(tag); });
  }
  for (int64_t step = start_step_; step < last; ++step) {
    std::function<void()> dump;
    if (step == start_step_ && !dump_grads_dir_.empty())
      dump = [&] { dump_shards(dump_grads_dir_, true); };
    progress.begin(step);
    // The first step is left out of an op profile (plans, caches and allocations are made
    // in it) unless it is the only one.
    const bool profiled = !op_profile_path_.empty() && (step > start_step_ || last == step + 1);
    if (profiled) kernels::op_profile::begin_step(t.device == "cuda");
    StepStats s = train_step(step, dump);
    if (profiled) kernels::op_profile::end_step();
    progress.done(s.seconds);
    parallel::activity_step_done(step + 1, s.seconds);
    history_.push_back(s);
    if (s.skipped) {
      ++skipped_steps_;
      if (skipped_steps_ > t.max_skipped_steps)
        fail(
            "step {}: loss {}, gradient norm {}: not finite, step {} of this run so, above "
            "train.max_skipped_steps = {}: training diverged (lower optim.lr, raise "
            "optim.warmup_steps, or resume from an earlier checkpoint)",
            step + 1, s.loss, s.grad_norm, skipped_steps_, t.max_skipped_steps);
      if (logs())
        spdlog::warn(
            "step {}: loss {}, gradient norm {}: not finite; nothing updated, the batch "
            "dropped ({} of train.max_skipped_steps = {})",
            step + 1, s.loss, s.grad_norm, skipped_steps_, t.max_skipped_steps);
    }
    checkpoints_->commit_pending(false);
    if (t.save_every > 0 && ((step + 1) % t.save_every == 0 || step + 1 == last))
      checkpoints_->save(step + 1);
    else if (checkpoints_->memory_due(step + 1))
      checkpoints_->save_to_memory(step + 1);
    report_step(s, run_start, last);
    if (eval && ((step + 1) % t.eval_every == 0 || step + 1 == last)) report_eval(step, evaluate());
    if (sampler && (step + 1) % t.sample_every == 0) sampler->print(*model_, step + 1);
  }
  survivors.reset();
  if (!samples_dir_.empty()) write_sample_ids();
  if (!op_profile_path_.empty()) write_op_profile();
  checkpoints_->finish_run();
  // The process's own high-water mark, against the memory plan printed at the start.
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const int peak_mib = int(usage.ru_maxrss / 1024);
  const int low = all_ranks(peak_mib, parallel::ReduceOp::Min);
  const int high = all_ranks(peak_mib, parallel::ReduceOp::Max);
  if (logs()) spdlog::info("peak resident memory per rank: {} to {} MiB", low, high);
  if (optimizer_->on_host() && logs())
    spdlog::info(
        "host AdamW (rank 0): {} of the last step's {} chunks took gradients brought down "
        "during backward",
        optimizer_->early_grad_chunks(), optimizer_->host_chunks());
  if (const NvmeState* nvme = optimizer_->nvme(); nvme && logs()) {
    const NvmeState::Stats io = nvme->stats();
    spdlog::info(
        "NVMe offload (rank 0): {:.2f} GB read, {:.2f} GB written; the optimizer waited {:.3f} s "
        "for reads and {:.3f} s for writes in all",
        io.bytes_read / 1e9, io.bytes_written / 1e9, io.read_wait_s, io.write_wait_s);
    if (optimizer_->params_offloaded())
      spdlog::info(
          "parameter shares on NVMe (rank 0): {:.2f} GB of the reads fetched them for the "
          "layers' all-gathers, which waited {:.3f} s for them in all",
          io.background_bytes / 1e9, io.background_wait_s);
  }
}

}  // namespace pentad
