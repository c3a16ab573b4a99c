// `pentad train` (launch/commands.h): each rank reads the recipe, starts (threads, device),
// checks its memory, builds the mesh and runs the Trainer, beating to `pentad launch`'s
// supervisor where one watches.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "launch/commands.h"
#include "launch/errors.h"
#include "launch/monitor.h"
#include "launch/rank.h"
#include "parallel/trace.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad::launch {
namespace {

struct TrainOptions {
  std::string recipe;
  std::vector<std::string> sets, extra;  // --set key=value, and trailing key=value words
  std::string resume, comm_log, trace, op_profile, dump_dir, grads_dir, samples_dir;
};

void add_train_options(CLI::App* train, TrainOptions& o) {
  train->add_option("recipe", o.recipe, "Recipe file (see recipes/)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("-s,--set", o.sets, "Override a recipe key: section.key=value (repeatable)");
  train->add_option("overrides", o.extra, "More section.key=value overrides");
  train->add_option("--resume", o.resume,
                    "Resume from 'latest' (newest valid checkpoint in train.ckpt_dir), a "
                    "checkpoint directory, or a root of them (its newest); any parallel layout");
  train->add_option("--comm-log", o.comm_log,
                    "Write each rank's communication trace and step spans (rankN.json) here");
  train->add_option("--trace", o.trace,
                    "Pipeline runs: write every rank's forward/backward/transfer spans of the last "
                    "steps as one Chrome-trace JSON (open in Perfetto) and print the bubble");
  train->add_option("--op-profile", o.op_profile,
                    "Time every op of each step but the first (on a GPU, on the device) and write "
                    "each rank's table as JSON here (with .rank<r> when there are several); rank "
                    "0 prints its own: share of the step, calls, TFLOP/s of GEMMs and attention");
  train->add_option("--dump-weights", o.dump_dir,
                    "Developer: write the final parameter shards (.npy) to this directory");
  train->add_option("--dump-grads", o.grads_dir,
                    "Developer: write the first step's reduced gradient shards (.npy) here");
  train->add_option("--dump-samples", o.samples_dir,
                    "Developer: write the training samples each step read (dp<r>.jsonl) here");
}

// Where the trainer saves (Trainer::checkpoint_roots()): the supervisor checks them before a
// restart.
std::vector<std::string> checkpoint_dirs(const Config& cfg) {
  std::vector<std::string> dirs;
  if (cfg.train.save_every > 0) {
    dirs.push_back(cfg.train.ckpt_dir.empty() ? cfg.train.out_dir + "/checkpoints"
                                              : cfg.train.ckpt_dir);
    if (!cfg.train.ckpt_mirror.empty()) dirs.push_back(cfg.train.ckpt_mirror);
  }
  return dirs;
}

// Builds the Trainer on `mesh` and runs it, with the developer outputs. Under `pentad launch`
// (PENTAD_MONITOR set) `monitor` beats to the supervisor from a thread.
int run_trainer(const TrainOptions& o, const Config& cfg, parallel::Mesh& mesh, Monitor& monitor,
                const cli::Job& job) {
  std::optional<Trainer> trainer;  // outside the try: see the catch
  try {
    trainer.emplace(cfg, &mesh);
    if (!o.grads_dir.empty()) trainer->dump_first_gradients(o.grads_dir);
    if (!o.samples_dir.empty()) trainer->dump_sample_ids(o.samples_dir);
    if (!o.op_profile.empty()) trainer->profile_ops(o.op_profile);
    trainer->run();
    monitor.finish(true);
    if (!o.dump_dir.empty()) trainer->dump_weights(o.dump_dir);
    if (!o.comm_log.empty()) trainer->write_comm_log(o.comm_log);
    if (!o.trace.empty() && trainer->write_timeline(o.trace) < 0)
      spdlog::warn("--trace: this run has no pipeline (parallel.pp = 1); no trace written");
  } catch (const std::exception& e) {
    // Report (and in a multi-rank job abort) while the trainer stands: unwinding it
    // waits on its pending collectives, which the other ranks may never finish and
    // whose buffers the unwinding may already have freed (a hang or a crash in place of
    // the error). The supervisor gets the error as this rank's bye, after it is printed
    // (told first, it could end the job before the line is out). Before the first step
    // the error is a refusal: the supervisor ends the job instead of restarting it.
    const bool refused = !(trainer && trainer->started());
    const int status = !cli::is_ours(e) ? cli::kInternal : refused ? cli::kRefused : cli::kFailed;
    // How long to wait for the other ranks' errors: an error every rank meets comes to
    // each within milliseconds; one that only this rank has costs the whole wait while
    // the others wait on it, and under `pentad launch` a wait of 2 s is a hang.
    const double agree_s = refused ? 1.0 : 0.25;
    return report_error(
        e, status, job,
        [&] {
          ByeCause cause;  // one the supervisor can check
          if (const auto* saves = dynamic_cast<const SavesFailed*>(&e))
            cause = {"checkpoint_save", saves->root};
          monitor.finish(false, e.what(), status == cli::kRefused, cause);
        },
        agree_s);
  }
  return 0;
}

int run_train(const TrainOptions& o, const cli::Job& job) {
  // Before the mesh every rank runs the same steps, with no collective in between that
  // one rank could leave the others waiting in: an error there is agreed on and printed
  // once (on_every_rank).
  Config cfg;
  parallel::MeshConfig layout;
  std::string layout_note;
  parallel::Backend backend{};
  if (const int status = job.on_every_rank([&] {
        std::vector<std::string> overrides = o.sets;
        overrides.insert(overrides.end(), o.extra.begin(), o.extra.end());
        if (!o.resume.empty()) overrides.push_back("train.resume=" + o.resume);
        cfg = load_recipe(o.recipe, overrides);
        // Written at the end of the run: its directory is made now, and one that cannot be is
        // refused before the training rather than after it.
        if (!o.op_profile.empty()) {
          const std::filesystem::path dir = std::filesystem::absolute(o.op_profile).parent_path();
          std::error_code ec;
          std::filesystem::create_directories(dir, ec);
          if (!std::filesystem::is_directory(dir))
            fail("--op-profile {}: cannot create the directory {}{}", o.op_profile, dir.string(),
                 ec ? ": " + ec.message() : "");
        }
        layout = mesh_config(cfg, job.size, &layout_note);
        apply_global_batch(cfg, layout.dp);
      }))
    return status;
  if (const int status = job.on_every_rank([&] { backend = start_rank(cfg); })) return status;
  const NodeShare share = node_share();
  std::string recompute_note;
  if (const int status = job.on_every_rank([&] {  // before any large allocation
        // Collective (every rank decides alike); the estimate before it fails on every rank
        // or on none, since every rank holds the same recipe and layout.
        recompute_note = resolve_recompute(cfg, layout, share);
        check_memory(cfg, layout, share);
      }))
    return status;
  if (job.rank == 0 && !recompute_note.empty()) spdlog::info("{}", recompute_note);
  if (job.rank == 0 && !layout_note.empty()) spdlog::info("{}", layout_note);
  auto mesh = parallel::Mesh::create(layout, MPI_COMM_WORLD, backend);
  spdlog::info("mesh: {}", mesh.describe());
  if (job.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 reports for all
  // SIGUSR1 (pentad launch's dump before it ends a job, or a person's): the communication
  // trace to stderr. (Its default would end the rank.)
  parallel::install_comm_dump_on_signal();
  Monitor monitor(job.rank, job.size, cfg.train.out_dir, 100,
                  {layout.dp, layout.tp, layout.cp, layout.pp, layout.ep, layout.etp,
                   cfg.train.micro_batch, cfg.train.grad_accum},
                  checkpoint_dirs(cfg));
  return run_trainer(o, cfg, mesh, monitor, job);
}

}  // namespace

void add_train_command(cli::Commands& commands) {
  auto& o = commands.keep<TrainOptions>();
  CLI::App* train = commands.app().add_subcommand("train", "Train a model from a TOML recipe");
  add_train_options(train, o);
  commands.add(train, [&o](const cli::Job& job) { return run_train(o, job); });
}

}  // namespace pentad::launch
