// pentad: the command line. Subcommands: train, plan, data prepare, tokenizer train, ckpt
// inspect/convert, and the developer command reference (used by the PyTorch equivalence
// tests). Each rank starts here: MPI, then launch/rank.h's threads and device, then the
// mesh and the Trainer. `pentad launch` (launch/supervisor.h) is no rank and starts first.
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/convert.h"
#include "cli/data_commands.h"
#include "launch/monitor.h"
#include "launch/rank.h"
#include "launch/supervisor.h"
#include "train/memory_budget.h"
#include "train/recipe.h"
#include "train/reference.h"
#include "train/trainer.h"

namespace {

struct Mpi {
  int rank = 0, size = 1;
  Mpi(int& argc, char**& argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  ~Mpi() { MPI_Finalize(); }
};

// What a rank does with an error: print it, then tell (`tell`: the supervisor, under
// `pentad launch`, which ends the job once told), and in a multi-rank job abort them all (a
// rank's error must stop the others, which may wait on it). Returns the exit status for a
// single-rank run.
int report_error(const std::exception& e, int ranks, const std::function<void()>& tell = {}) {
  const bool ours = dynamic_cast<const pentad::Error*>(&e) != nullptr;
  std::fprintf(stderr, "pentad: %s: %s\n", ours ? "error" : "internal error", e.what());
  if (tell) tell();
  const int status = ours ? 2 : 3;
  if (ranks > 1) MPI_Abort(MPI_COMM_WORLD, status);
  return status;
}

// Recipe overrides come as --set key=value or as trailing key=value words.
std::vector<std::string> overrides_from(const std::vector<std::string>& sets,
                                        const std::vector<std::string>& extra) {
  std::vector<std::string> all = sets;
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  // The supervisor is no MPI process: an MPI_Init here would leak OMPI_* into the job it starts.
  if (argc > 1 && std::string(argv[1]) == "launch")
    return pentad::launch::supervise_main(argc - 1, argv + 1);
  Mpi mpi(argc, argv);
  spdlog::set_pattern(fmt::format("%H:%M:%S [rank {}] %v", mpi.rank));

  CLI::App app{"pentad: 5D-parallel trainer for GPT and MoE language models"};
  app.require_subcommand(1);

  std::string recipe;
  std::vector<std::string> sets, extra;
  auto* train = app.add_subcommand("train", "Train a model from a TOML recipe");
  train->add_option("recipe", recipe, "Recipe file (see recipes/)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("-s,--set", sets, "Override a recipe key: section.key=value (repeatable)");
  train->add_option("overrides", extra, "More section.key=value overrides");
  std::string dump_dir, grads_dir, comm_log, resume, trace;
  train->add_option("--resume", resume,
                    "Resume from 'latest' (newest valid checkpoint in train.ckpt_dir) or a "
                    "checkpoint directory; any parallel layout");
  train->add_option("--comm-log", comm_log,
                    "Write each rank's communication trace and step spans (rankN.json) here");
  train->add_option("--trace", trace,
                    "Pipeline runs: write every rank's forward/backward/transfer spans of the last "
                    "steps as one Chrome-trace JSON (open in Perfetto) and print the bubble");
  train->add_option("--dump-weights", dump_dir,
                    "Developer: write the final parameter shards (.npy) to this directory");
  train->add_option("--dump-grads", grads_dir,
                    "Developer: write the first step's reduced gradient shards (.npy) here");

  std::string ref_out, ref_checkpoint;
  int64_t ref_steps = 10;
  auto* reference = app.add_subcommand(
      "reference",
      "Developer: dump weights, batches, logits, gradients and losses for the PyTorch tests");
  reference->add_option("recipe", recipe, "Recipe file")->required()->check(CLI::ExistingFile);
  reference->add_option("-o,--out", ref_out, "Output directory")->required();
  reference->add_option("--steps", ref_steps, "AdamW steps to record")->capture_default_str();
  reference->add_option("--checkpoint", ref_checkpoint,
                        "Start from this checkpoint directory's weights, not the initialisation");
  reference->add_option("-s,--set", sets, "Override a recipe key (repeatable)");

  int64_t plan_ranks = 0;
  auto* plan = app.add_subcommand(
      "plan",
      "Check a recipe and print the memory each rank would need, allocating nothing (plans "
      "for more ranks or larger machines than this one)");
  plan->add_option("recipe", recipe, "Recipe file")->required()->check(CLI::ExistingFile);
  plan->add_option(
      "--ranks", plan_ranks,
      "Ranks to plan for (default: the recipe's parallel degrees; dp 0: the fewest that "
      "split the experts)");
  plan->add_option("-s,--set", sets, "Override a recipe key (repeatable)");
  plan->add_option("overrides", extra, "More section.key=value overrides");

  auto* data = app.add_subcommand("data", "Data preparation");
  data->require_subcommand(1);
  std::vector<std::string> inputs;
  std::string tokenizer, out_prefix;
  bool fortune_format = false;
  auto* prepare = data->add_subcommand(
      "prepare", "Tokenize text files into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx)");
  prepare->add_option("inputs", inputs, "Text files")->required()->check(CLI::ExistingFile);
  prepare->add_option("-t,--tokenizer", tokenizer, "tokenizer.json (Hugging Face byte-level BPE)")
      ->required()
      ->check(CLI::ExistingFile);
  prepare->add_option("-o,--out", out_prefix, "Output prefix")->required();
  prepare->add_flag("--fortune", fortune_format, "Documents are separated by lines holding '%'");

  auto* tok = app.add_subcommand("tokenizer", "Tokenizers");
  tok->require_subcommand(1);
  int64_t vocab_size = 8192;
  std::string tok_out;
  auto* tok_train =
      tok->add_subcommand("train", "Learn a byte-level BPE vocabulary from text files");
  tok_train->add_option("inputs", inputs, "Text files")->required()->check(CLI::ExistingFile);
  tok_train->add_option("-v,--vocab-size", vocab_size, "Vocabulary size, <|endoftext|> included")
      ->capture_default_str();
  tok_train->add_option("-o,--out", tok_out, "Output tokenizer.json")->required();

  auto* ckpt = app.add_subcommand("ckpt", "Checkpoint tools");
  ckpt->require_subcommand(1);
  std::string ckpt_path;
  bool verify = false, recipe_only = false;
  auto* inspect = ckpt->add_subcommand("inspect", "Show a checkpoint's step, layout and tensors");
  inspect->add_option("checkpoint", ckpt_path, "Checkpoint directory (step-N)")->required();
  inspect->add_flag("--verify", verify, "Read every tensor and check its checksum");
  inspect->add_flag("--recipe", recipe_only,
                    "Print only the recorded recipe (TOML: a recipe file to train on from here)");
  std::string convert_to, convert_from, convert_src, convert_dst;
  auto* convert = ckpt->add_subcommand(
      "convert",
      "Convert checkpoints: --to hf CHECKPOINT OUT_DIR | --to llmc CHECKPOINT OUT_FILE | "
      "--from hf HF_DIR CHECKPOINT_ROOT");
  auto* to = convert->add_option("--to", convert_to, "Export format")
                 ->check(CLI::IsMember({"hf", "llmc"}));
  auto* from =
      convert->add_option("--from", convert_from, "Import format")->check(CLI::IsMember({"hf"}));
  to->excludes(from);
  convert->add_option("source", convert_src, "Checkpoint directory (step-N), or HF directory")
      ->required();
  convert->add_option("destination", convert_dst, "Output directory, file, or checkpoint root")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
  }

  try {
    if (*train) {
      std::vector<std::string> overrides = overrides_from(sets, extra);
      if (!resume.empty()) overrides.push_back("train.resume=" + resume);
      pentad::Config cfg = pentad::load_recipe(recipe, overrides);
      const pentad::parallel::Backend backend = pentad::launch::start_rank(cfg);
      const pentad::parallel::MeshConfig layout = pentad::mesh_config(cfg, mpi.size);
      pentad::check_memory(cfg, layout, pentad::node_share());  // before any large allocation
      auto mesh = pentad::parallel::Mesh::create(layout, MPI_COMM_WORLD, backend);
      spdlog::info("mesh: {}", mesh.describe());
      if (mpi.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 reports for all
      // Under `pentad launch` (PENTAD_MONITOR set): beats to the supervisor from a thread.
      pentad::launch::Monitor monitor(mpi.rank, mpi.size, cfg.train.out_dir, 100,
                                      {layout.dp, layout.tp, layout.cp, layout.pp, layout.ep,
                                       layout.etp, cfg.train.micro_batch, cfg.train.grad_accum});
      std::optional<pentad::Trainer> trainer;  // outside the try: see the catch
      try {
        trainer.emplace(cfg, &mesh);
        if (!grads_dir.empty()) trainer->dump_first_gradients(grads_dir);
        trainer->run();
        monitor.finish(true);
        if (!dump_dir.empty()) trainer->dump_weights(dump_dir);
        if (!comm_log.empty()) trainer->write_comm_log(comm_log);
        if (!trace.empty() && trainer->write_timeline(trace) < 0)
          spdlog::warn("--trace: this run has no pipeline (parallel.pp = 1); no trace written");
      } catch (const std::exception& e) {
        // Report (and in a multi-rank job abort) while the trainer stands: unwinding it
        // waits on its pending collectives, which the other ranks may never finish and
        // whose buffers the unwinding may already have freed (a hang or a crash in place of
        // the error). The supervisor gets the error as this rank's bye, after it is printed
        // (told first, it could end the job before the line is out).
        return report_error(e, mpi.size, [&] { monitor.finish(false, e.what()); });
      }
    } else if (*plan) {
      pentad::Config cfg = pentad::load_recipe(recipe, overrides_from(sets, extra));
      const pentad::ParallelConfig& p = cfg.parallel;
      // dp 0: the fewest data-parallel ranks over which the experts split (ep x etp).
      const int64_t dp = p.dp > 0 ? p.dp : p.ep * p.etp / std::gcd(p.ep * p.etp, p.cp * p.tp);
      const int64_t ranks = plan_ranks > 0 ? plan_ranks : dp * p.tp * p.cp * p.pp;
      const pentad::parallel::MeshConfig layout = pentad::mesh_config(cfg, int(ranks));
      if (mpi.rank == 0) std::puts(pentad::describe_memory(cfg, layout).c_str());
      // Against train.memory_limit_mb when set (this machine's memory says nothing of the
      // machines planned for).
      if (cfg.train.memory_limit_mb > 0) pentad::check_memory(cfg, layout, pentad::NodeShare{});
    } else if (*reference) {
      pentad::Config cfg = pentad::load_recipe(recipe, sets);
      pentad::launch::start_rank(cfg);
      pentad::export_reference(cfg, ref_out, ref_steps, ref_checkpoint);
    } else if (*convert) {
      std::string summary;
      if (convert_to == "hf")
        summary = pentad::ckpt::export_hf(convert_src, convert_dst);
      else if (convert_to == "llmc")
        summary = pentad::ckpt::export_llmc(convert_src, convert_dst);
      else if (convert_from == "hf")
        summary = pentad::ckpt::import_hf(convert_src, convert_dst);
      else
        pentad::fail("ckpt convert needs --to hf|llmc or --from hf");
      std::puts(summary.c_str());
    } else if (*inspect) {
      if (recipe_only)
        std::fputs(pentad::ckpt::Reader(ckpt_path).manifest().recipe_toml.c_str(), stdout);
      else
        std::fputs(pentad::ckpt::inspect(ckpt_path, verify).c_str(), stdout);
    } else if (*prepare) {
      pentad::data::data_prepare(inputs, tokenizer, out_prefix, fortune_format);
    } else if (*tok_train) {
      pentad::data::tokenizer_train(inputs, vocab_size, tok_out);
    }
  } catch (const std::exception& e) {
    return report_error(e, mpi.size);
  }
  return 0;
}
