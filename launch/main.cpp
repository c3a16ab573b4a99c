// pentad: the command line. Subcommands: train, plan, probe, data prepare, tokenizer
// train/encode/decode, ckpt inspect/convert, plot, and the developer command reference (used
// by the PyTorch equivalence tests). Each rank starts here: MPI, then launch/rank.h's threads
// and device, then the mesh and the Trainer. `pentad launch` (launch/supervisor.h) and
// `pentad plot` (cli/plot.h) are no ranks and start first.
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/convert.h"
#include "cli/data_commands.h"
#include "cli/generate.h"
#include "cli/plot.h"
#include "cli/probe.h"
#include "cli/tokenizer_commands.h"
#include "kernels/door.h"
#include "launch/monitor.h"
#include "launch/rank.h"
#include "launch/supervisor.h"
#include "plan/memory_budget.h"
#include "plan/plan_command.h"
#include "plan/plan_search.h"
#include "recipe/recipe.h"
#include "train/reference.h"
#include "train/trainer.h"

namespace {

struct Mpi {
  int rank = 0, size = 1;
  MPI_Comm errors = MPI_COMM_NULL;  // the ranks' agreement on an error alone (report_error)
  Mpi(int& argc, char**& argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_dup(MPI_COMM_WORLD, &errors);
  }
  ~Mpi() {
    MPI_Comm_free(&errors);
    MPI_Finalize();
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
};

// Exit statuses. A refusal (2) is an error every attempt would meet again: the recipe, a
// file or directory, the layout or the memory cannot run as given, found before the first
// step; `pentad launch` ends the job on it instead of restarting. A failure (1) comes during
// training (restartable); an internal error (3) is pentad's own bug.
constexpr int kFailed = 1, kRefused = 2, kInternal = 3;

bool is_ours(const std::exception& e) {
  return dynamic_cast<const pentad::Error*>(&e) != nullptr;
}

// The words of one error line: "pentad: error: ..." (or "internal error"), with the rank
// when other ranks may print their own.
void print_error(const std::exception& e, int rank) {
  const char* what = is_ours(e) ? "error" : "internal error";
  if (rank < 0)
    std::fprintf(stderr, "pentad: %s: %s\n", what, e.what());
  else
    std::fprintf(stderr, "pentad: %s (rank %d): %s\n", what, rank, e.what());
  std::fflush(stderr);
}

// What the ranks agree on about an error, in one all-reduce (MPI_MAX) of four words: whether
// some rank has none, the largest exit status (0: no rank has an error), and the smallest
// (as its complement) and largest hash of the errors' words.
struct Agreement {
  unsigned long long words[4] = {0, 0, 0, 0};
  Agreement(const std::exception* e, int status) {
    const unsigned long long h = e ? std::hash<std::string>{}(e->what()) : 0;
    words[0] = e ? 0 : 1;
    words[1] = e ? static_cast<unsigned long long>(status) : 0;
    words[2] = e ? ~h : 0;
    words[3] = e ? h : 0;
  }
  int status() const { return int(words[1]); }
  // One error line for the whole job where every rank has the same error.
  bool unanimous() const { return words[0] == 0 && ~words[2] == words[3]; }
  void print(const std::exception* e, int rank, int size) const {
    if (!e) return;
    if (!unanimous())
      print_error(*e, size > 1 ? rank : -1);  // only some ranks: each says which it is
    else if (rank == 0)
      print_error(*e, -1);
  }
};

// Where every rank stands at the same point, none inside a collective (the steps before the
// mesh: reading the recipe, the layout, the memory check), the ranks agree on an error
// before any of them reports it. Returns 0 when no rank has one; else every rank returns
// the job's status after the error is printed once (or once per rank that has it), and the
// ranks end through MPI_Finalize: no MPI_Abort, whose boilerplate would bury the message.
int agree_at_barrier(const std::exception* e, int status, int rank, int size) {
  Agreement a(e, status);
  MPI_Allreduce(MPI_IN_PLACE, a.words, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  a.print(e, rank, size);
  return a.status();
}

// Runs `step` on every rank, then agree_at_barrier: 0 when no rank failed.
int on_every_rank(const Mpi& mpi, const std::function<void()>& step) {
  try {
    step();
  } catch (const std::exception& e) {
    return agree_at_barrier(&e, is_ours(e) ? kRefused : kInternal, mpi.rank, mpi.size);
  }
  return agree_at_barrier(nullptr, 0, mpi.rank, mpi.size);
}

// An error where the other ranks may be inside a collective (building or running the
// trainer). This rank waits up to `seconds` for the others to report an error too, through
// a non-blocking all-reduce on `comm` (kept for this alone), so that an error every rank
// meets is printed once; then `tell` (the supervisor) and, in a multi-rank job, MPI_Abort
// ends them all (a rank may be waiting on this one). Returns the status of a single rank.
int report_error(const std::exception& e, int status, int rank, int size, MPI_Comm comm,
                 const std::function<void()>& tell = {}, double seconds = 1.0) {
  Agreement a(&e, status);
  if (size > 1) {
    Agreement reduced = a;
    MPI_Request request;
    MPI_Iallreduce(a.words, reduced.words, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm, &request);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Not every rank came: some have no error (or have not met theirs yet).
    a.words[0] = done ? reduced.words[0] : 1;
    if (done) std::copy(reduced.words + 1, reduced.words + 4, a.words + 1);
  }
  a.print(&e, rank, size);
  if (tell) tell();
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, status);
  return status;
}

// Recipe overrides come as --set key=value or as trailing key=value words.
std::vector<std::string> overrides_from(const std::vector<std::string>& sets,
                                        const std::vector<std::string>& extra) {
  std::vector<std::string> all = sets;
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

// The plot subcommand's options, for `pentad plot` itself and for `pentad --help`.
void add_plot_options(CLI::App* plot, std::vector<std::string>& run_dirs, std::string& out) {
  plot->add_option("run_dirs", run_dirs, "Run directories (train.out_dir), one colour each")
      ->required();
  plot->add_option("-o,--out", out, "PNG file to write")->required();
}

// `pentad plot`: a Python script draws the figure, so no MPI starts (a child process of an
// MPI singleton is one Open MPI warns about).
int plot_main(int argc, char** argv) {
  CLI::App app{
      "pentad plot: training curves of runs (loss and eval loss, learning rate, "
      "tokens/s, gradient norm against the step)",
      "pentad plot"};
  std::vector<std::string> run_dirs;
  std::string out;
  add_plot_options(&app, run_dirs, out);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kRefused;
  }
  try {
    return pentad::plot_curves(run_dirs, out);
  } catch (const pentad::Error& e) {
    print_error(e, -1);
    return kRefused;
  }
}

// `pentad --version`: the release (CMake's project version) and the backends compiled in.
std::string pentad_version() {
  return fmt::format("pentad {} (backends: cpu{})", PENTAD_VERSION,
                     pentad::kernels::kCudaBuilt ? ", cuda" : "");
}

}  // namespace

int main(int argc, char** argv) {
  // The supervisor is no MPI process: an MPI_Init here would leak OMPI_* into the job it starts.
  if (argc > 1 && std::string(argv[1]) == "launch")
    return pentad::launch::supervise_main(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "plot") return plot_main(argc - 1, argv + 1);
  // Before MPI_Init, which would abort here with a message that names no cause. Every task
  // gets the same environment but one, SLURM_PROCID 0, says why.
  if (const std::string why = pentad::launch::mpi_start_refusal(std::getenv); !why.empty()) {
    const char* task = std::getenv("SLURM_PROCID");
    if (!task || std::string(task) == "0") std::fprintf(stderr, "pentad: error: %s\n", why.c_str());
    return 2;
  }
  pentad::launch::prepare_singleton_start();
  Mpi mpi(argc, argv);
  spdlog::set_pattern(fmt::format("%H:%M:%S [rank {}] %v", mpi.rank));

  CLI::App app{"pentad: 5D-parallel trainer for GPT and MoE language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", pentad_version(), "Print pentad's version and backends");

  std::string recipe;
  std::vector<std::string> sets, extra;
  // Listed for --help only: main() hands `pentad launch` to the supervisor before MPI starts.
  app.add_subcommand("launch",
                     "Supervise a job: pentad launch [OPTIONS] -- mpirun ... pentad train ...; "
                     "names a dead, hung or slow rank and restarts from the last checkpoint "
                     "(pentad launch --help)")
      ->allow_extras();
  std::vector<std::string> plot_run_dirs;  // for --help: main() hands `pentad plot` over first
  std::string plot_out;
  add_plot_options(app.add_subcommand("plot",
                                      "Draw runs' training curves into a PNG: pentad plot RUN_DIR "
                                      "[RUN_DIR ...] -o curves.png (matplotlib)"),
                   plot_run_dirs, plot_out);
  auto* train = app.add_subcommand("train", "Train a model from a TOML recipe");
  train->add_option("recipe", recipe, "Recipe file (see recipes/)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("-s,--set", sets, "Override a recipe key: section.key=value (repeatable)");
  train->add_option("overrides", extra, "More section.key=value overrides");
  std::string dump_dir, grads_dir, samples_dir, comm_log, resume, trace;
  train->add_option("--resume", resume,
                    "Resume from 'latest' (newest valid checkpoint in train.ckpt_dir), a "
                    "checkpoint directory, or a root of them (its newest); any parallel layout");
  train->add_option("--comm-log", comm_log,
                    "Write each rank's communication trace and step spans (rankN.json) here");
  train->add_option("--trace", trace,
                    "Pipeline runs: write every rank's forward/backward/transfer spans of the last "
                    "steps as one Chrome-trace JSON (open in Perfetto) and print the bubble");
  train->add_option("--dump-weights", dump_dir,
                    "Developer: write the final parameter shards (.npy) to this directory");
  train->add_option("--dump-grads", grads_dir,
                    "Developer: write the first step's reduced gradient shards (.npy) here");
  train->add_option("--dump-samples", samples_dir,
                    "Developer: write the training samples each step read (dp<r>.jsonl) here");

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

  pentad::PlanArgs plan_args;
  auto* plan = app.add_subcommand(
      "plan",
      "Check a recipe and print the memory each rank would need, allocating nothing; with "
      "--ranks N, search every layout of N ranks and rank them by predicted step time "
      "(docs/plan.md)");
  plan->add_option("recipe", plan_args.recipe, "Recipe file")->check(CLI::ExistingFile);
  plan->add_option("--ranks", plan_args.ranks,
                   "Search the layouts of this many ranks (predicted step time, tokens/s, MFU, "
                   "memory per rank)");
  plan->add_option("--topology", plan_args.topology,
                   "The links: a `pentad probe` file for these ranks (default: the cluster "
                   "preset's, or this machine's)");
  plan->add_option("--cluster", plan_args.cluster,
                   "A GPU cluster preset: dgx-a100 or dgx-h100, optionally :NODES (default: this "
                   "CPU machine, from its calibration)");
  plan->add_option("--engine", plan_args.engine,
                   "Whose implementation to predict: pentad, or megatron-core (its overlaps, to "
                   "compare with its published figures; needs --cluster)")
      ->capture_default_str();
  plan->add_option("--memory-gb", plan_args.memory_gb,
                   "Memory per rank, GB (default: train.memory_limit_mb, else the GPU's, else this "
                   "machine's share)");
  plan->add_option("--top", plan_args.top, "Rows of the ranked table")->capture_default_str();
  plan->add_flag("--json", plan_args.json, "Every layout that fits, ranked, as JSON");
  plan->add_option("--write", plan_args.write, "Write the recipe with the best layout here (TOML)");
  plan->add_option("--layout", plan_args.layout,
                   "Fix these fields and search the rest, e.g. \"tp=8,pp=4,dp=32,vp=2,mb=1\" "
                   "(fields: " +
                       pentad::layout_fields() + ")");
  plan->add_flag("--calibrate", plan_args.calibrate,
                 "Time this machine's kernels and write the table the CPU cost model reads");
  plan->add_option("--calibration", plan_args.calibration,
                   "The kernel table (default: $PENTAD_CALIBRATION, else "
                   "~/.cache/pentad/calibration.json)");
  plan->add_option("-s,--set", sets, "Override a recipe key (repeatable)");
  plan->add_option("overrides", extra, "More section.key=value overrides");

  pentad::probe::ProbeOptions probe_options;
  auto* probe = app.add_subcommand(
      "probe",
      "Measure the links and collectives of this job's ranks (run under mpirun) and "
      "write a topology file for the planner (docs/probe.md)");
  probe->add_option("-o,--out", probe_options.out, "Topology file to write")->capture_default_str();
  probe->add_flag("--quick", probe_options.quick,
                  "One size per collective and fewer repetitions: seconds, for tests");

  auto* recipe_cmd = app.add_subcommand("recipe", "Recipe tools");
  recipe_cmd->require_subcommand(1);
  bool markdown = false;
  auto* keys = recipe_cmd->add_subcommand(
      "keys", "List every recipe key with its type, allowed values, default and meaning");
  keys->add_flag("--markdown", markdown,
                 "As docs/recipe-keys.md (a test checks that file against this output)");

  auto* data = app.add_subcommand("data", "Data preparation");
  data->require_subcommand(1);
  std::vector<std::string> inputs;
  auto* prepare = data->add_subcommand(
      "prepare", "Tokenize text files into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx)");
  pentad::data::PrepareOptions prep;
  prepare
      ->add_option("inputs", prep.inputs,
                   "Input files or quoted globs: *.jsonl[.gz] (JSON lines), else text "
                   "(one document per file, or --fortune), each optionally .gz or .zst")
      ->required();
  prepare
      ->add_option("-t,--tokenizer", prep.tokenizer_json,
                   "tokenizer.json (Hugging Face byte-level BPE) or tokenizer.model "
                   "(SentencePiece)")
      ->required()
      ->check(CLI::ExistingFile);
  prepare->add_option("-o,--out", prep.out_prefix, "Output prefix")->required();
  prepare->add_flag("--fortune", prep.fortune_format,
                    "Text documents are separated by lines holding '%'");
  prepare->add_option("--json-key", prep.json_key, "JSONL: the key that holds the text")
      ->capture_default_str();
  prepare->add_option("--eod", prep.eod,
                      "Token appended to every document (default <|endoftext|>)");
  prepare->add_option("--bos", prep.bos, "Token prepended to every document (default none)");
  prepare->add_flag("--skip-bad", prep.skip_bad,
                    "Skip (and count) bad JSON lines and invalid UTF-8 instead of stopping");
  prepare->add_option("--threads", prep.threads, "Tokenizing threads (default: every core)")
      ->check(CLI::NonNegativeNumber);

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
  std::string tok_file;
  bool allow_special = false;
  auto* tok_encode = tok->add_subcommand(
      "encode",
      "Encode documents from stdin, one per line as a JSON string or {\"text\": ...}; writes "
      "one line of space-separated ids per document");
  tok_encode->add_option("tokenizer", tok_file, "tokenizer.json or tokenizer.model")
      ->required()
      ->check(CLI::ExistingFile);
  tok_encode->add_flag("--special", allow_special,
                       "Special tokens written in the text (\"<|endoftext|>\") become their ids; "
                       "by default they stay text");
  auto* tok_decode = tok->add_subcommand(
      "decode", "Decode lines of space-separated ids from stdin; writes one JSON string per line");
  tok_decode->add_option("tokenizer", tok_file, "tokenizer.json or tokenizer.model")
      ->required()
      ->check(CLI::ExistingFile);

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
  bool convert_overwrite = false;
  std::string convert_tokenizer;
  convert
      ->add_option("--tokenizer", convert_tokenizer,
                   "--to hf: the tokenizer to export instead of the one the checkpoint "
                   "carries (or, for older checkpoints, the recipe's)")
      ->check(CLI::ExistingFile);
  convert->add_flag("--overwrite", convert_overwrite,
                    "Replace an existing export (--to hf: the directory's weights, config and "
                    "tokenizer files; --to llmc: the file)");
  convert->add_option("source", convert_src, "Checkpoint directory (step-N), or HF directory")
      ->required();
  convert->add_option("destination", convert_dst, "Output directory, file, or checkpoint root")
      ->required();

  pentad::ckpt::GenerateOptions gen;
  auto* generate = app.add_subcommand(
      "generate", "Continue a prompt from a checkpoint's weights (docs/generate.md)");
  generate->add_option("checkpoint", gen.checkpoint, "Checkpoint directory (step-N), any layout")
      ->required();
  generate->add_option("--prompt", gen.prompt, "Text to continue");
  generate->add_option("--prompt-ids", gen.prompt_ids,
                       "Comma-separated token ids to continue instead of text");
  generate->add_option("--tokenizer", gen.tokenizer,
                       "tokenizer.json or tokenizer.model to use instead of the one the "
                       "checkpoint carries (or, for older checkpoints, the recipe's)");
  generate->add_flag("--ignore-eos", gen.ignore_eos,
                     "Go on past the end-of-text token, to --max-tokens");
  generate->add_option("--max-tokens", gen.max_tokens, "Most tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.sampling.temperature, "0: greedy")
      ->capture_default_str();
  generate->add_option("--top-k", gen.sampling.top_k, "Keep the k most likely tokens (0: all)")
      ->capture_default_str();
  generate->add_option("--top-p", gen.sampling.top_p, "Nucleus mass to keep (1: all)")
      ->capture_default_str();
  generate->add_option("--seed", gen.sampling.seed, "Sampling seed")->capture_default_str();
  generate->add_flag("--print-ids", gen.print_ids,
                     "Print the generated token ids (one comma-separated line) instead of text");
  generate->add_option("--device", gen.device, "Where to run: cpu, or cuda (the first GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  generate->add_option("--precision", gen.precision, "fp32, or bf16 (with --device cuda)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  generate->add_flag("--no-cache", gen.no_cache,
                     "Run the whole training forward for every token instead of decoding from "
                     "a key/value cache (slower; the reference the cache is tested against)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own statuses (105 a failed check, 106 a missing argument, ...) would be the only
    // usage errors not to exit 2; --help and --version exit 0.
    const int status = mpi.rank == 0 ? app.exit(e) : e.get_exit_code();
    return status == 0 ? 0 : kRefused;
  }

  try {
    if (*train) {
      // Before the mesh every rank runs the same steps, with no collective in between that
      // one rank could leave the others waiting in: an error there is agreed on and printed
      // once (agree_at_barrier).
      pentad::Config cfg;
      pentad::parallel::MeshConfig layout;
      std::string layout_note;
      pentad::parallel::Backend backend{};
      if (const int status = on_every_rank(mpi, [&] {
            std::vector<std::string> overrides = overrides_from(sets, extra);
            if (!resume.empty()) overrides.push_back("train.resume=" + resume);
            cfg = pentad::load_recipe(recipe, overrides);
            layout = pentad::mesh_config(cfg, mpi.size, &layout_note);
            pentad::apply_global_batch(cfg, layout.dp);
          }))
        return status;
      if (const int status = on_every_rank(mpi, [&] { backend = pentad::launch::start_rank(cfg); }))
        return status;
      const pentad::NodeShare share = pentad::node_share();
      if (const int status = on_every_rank(mpi, [&] {  // before any large allocation
            pentad::check_memory(cfg, layout, share);
          }))
        return status;
      if (mpi.rank == 0 && !layout_note.empty()) spdlog::info("{}", layout_note);
      auto mesh = pentad::parallel::Mesh::create(layout, MPI_COMM_WORLD, backend);
      spdlog::info("mesh: {}", mesh.describe());
      if (mpi.rank != 0) spdlog::set_level(spdlog::level::warn);  // rank 0 reports for all
      // Under `pentad launch` (PENTAD_MONITOR set): beats to the supervisor from a thread.
      // Where it saves (Trainer::checkpoint_roots()): the supervisor checks them before a
      // restart.
      std::vector<std::string> ckpt_dirs;
      if (cfg.train.save_every > 0) {
        ckpt_dirs.push_back(cfg.train.ckpt_dir.empty() ? cfg.train.out_dir + "/checkpoints"
                                                       : cfg.train.ckpt_dir);
        if (!cfg.train.ckpt_mirror.empty()) ckpt_dirs.push_back(cfg.train.ckpt_mirror);
      }
      pentad::launch::Monitor monitor(mpi.rank, mpi.size, cfg.train.out_dir, 100,
                                      {layout.dp, layout.tp, layout.cp, layout.pp, layout.ep,
                                       layout.etp, cfg.train.micro_batch, cfg.train.grad_accum},
                                      ckpt_dirs);
      std::optional<pentad::Trainer> trainer;  // outside the try: see the catch
      try {
        trainer.emplace(cfg, &mesh);
        if (!grads_dir.empty()) trainer->dump_first_gradients(grads_dir);
        if (!samples_dir.empty()) trainer->dump_sample_ids(samples_dir);
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
        // (told first, it could end the job before the line is out). Before the first step
        // the error is a refusal: the supervisor ends the job instead of restarting it.
        const bool refused = !(trainer && trainer->started());
        const int status = !is_ours(e) ? kInternal : refused ? kRefused : kFailed;
        // How long to wait for the other ranks' errors: an error every rank meets comes to
        // each within milliseconds; one that only this rank has costs the whole wait while
        // the others wait on it, and under `pentad launch` a wait of 2 s is a hang.
        const double agree_s = refused ? 1.0 : 0.25;
        return report_error(
            e, status, mpi.rank, mpi.size, mpi.errors,
            [&] {
              pentad::launch::ByeCause cause;  // one the supervisor can check
              if (const auto* saves = dynamic_cast<const pentad::SavesFailed*>(&e))
                cause = {"checkpoint_save", saves->root};
              monitor.finish(false, e.what(), status == kRefused, cause);
            },
            agree_s);
      }
    } else if (*plan) {
      plan_args.overrides = overrides_from(sets, extra);
      pentad::plan_command(plan_args, mpi.rank == 0);
    } else if (*probe) {
      // Both refusals before any rank measures: a missing directory, a bad PENTAD_SIM_NODES.
      if (const int status = on_every_rank(mpi, [&] {
            pentad::probe::check_output(probe_options.out);
            pentad::parallel::simulated_nodes_from_env();
          }))
        return status;
      if (mpi.rank != 0) spdlog::set_level(spdlog::level::warn);
      const pentad::parallel::Topology topology =
          pentad::probe::run_probe(MPI_COMM_WORLD, probe_options);
      if (mpi.rank == 0) std::fputs(pentad::probe::describe(topology).c_str(), stdout);
    } else if (*reference) {
      pentad::Config cfg = pentad::load_recipe(recipe, sets);
      pentad::launch::start_rank(cfg);
      pentad::export_reference(cfg, ref_out, ref_steps, ref_checkpoint);
    } else if (*convert) {
      std::string summary;
      if (convert_to == "hf")
        summary =
            pentad::ckpt::export_hf(convert_src, convert_dst, convert_overwrite, convert_tokenizer);
      else if (convert_to == "llmc")
        summary = pentad::ckpt::export_llmc(convert_src, convert_dst, convert_overwrite);
      else if (convert_from == "hf")
        summary = pentad::ckpt::import_hf(convert_src, convert_dst);
      else
        pentad::fail("ckpt convert needs --to hf|llmc or --from hf");
      std::puts(summary.c_str());
    } else if (*generate) {
      if (mpi.size > 1) pentad::fail("generate runs in one process: start it without mpirun");
      pentad::ckpt::generate(gen);
    } else if (*inspect) {
      if (recipe_only)
        std::fputs(pentad::ckpt::Reader(ckpt_path).manifest().recipe_toml.c_str(), stdout);
      else
        std::fputs(pentad::ckpt::inspect(ckpt_path, verify).c_str(), stdout);
    } else if (*keys) {
      if (mpi.rank == 0) {
        if (markdown)
          std::fputs(pentad::recipe_keys_markdown().c_str(), stdout);
        else
          for (const std::string& key : pentad::recipe_keys()) std::puts(key.c_str());
      }
    } else if (*prepare) {
      pentad::data::data_prepare(prep);
    } else if (*tok_train) {
      pentad::data::tokenizer_train(inputs, vocab_size, tok_out);
    } else if (*tok_encode) {
      pentad::data::tokenizer_encode(tok_file, allow_special, std::cin, std::cout);
    } else if (*tok_decode) {
      pentad::data::tokenizer_decode(tok_file, std::cin, std::cout);
    }
  } catch (const std::exception& e) {
    return report_error(e, is_ours(e) ? kRefused : kInternal, mpi.rank, mpi.size, mpi.errors);
  }
  return 0;
}
