// `pentad ckpt inspect` and `pentad ckpt convert` (cli/convert.h).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "cli/command.h"
#include "cli/convert.h"
#include "core/check.h"

namespace pentad::cli {
namespace {

void add_inspect(Commands& commands, CLI::App* ckpt) {
  struct Options {
    std::string checkpoint;
    bool verify = false, recipe_only = false;
  };
  auto& o = commands.keep<Options>();
  CLI::App* inspect =
      ckpt->add_subcommand("inspect", "Show a checkpoint's step, layout and tensors");
  inspect->add_option("checkpoint", o.checkpoint, "Checkpoint directory (step-N)")->required();
  inspect->add_flag("--verify", o.verify, "Read every tensor and check its checksum");
  inspect->add_flag("--recipe", o.recipe_only,
                    "Print only the recorded recipe (TOML: a recipe file to train on from here)");
  commands.add(inspect, [&o](const Job&) {
    if (o.recipe_only)
      std::fputs(ckpt::Reader(o.checkpoint).manifest().recipe_toml.c_str(), stdout);
    else
      std::fputs(ckpt::inspect(o.checkpoint, o.verify).c_str(), stdout);
    return 0;
  });
}

void add_convert(Commands& commands, CLI::App* ckpt) {
  struct Options {
    std::string to, from, source, destination, tokenizer;
    bool overwrite = false;
  };
  auto& o = commands.keep<Options>();
  CLI::App* convert = ckpt->add_subcommand(
      "convert",
      "Convert checkpoints: --to hf CHECKPOINT OUT_DIR | --to llmc CHECKPOINT OUT_FILE | "
      "--from hf HF_DIR CHECKPOINT_ROOT");
  auto* to =
      convert->add_option("--to", o.to, "Export format")->check(CLI::IsMember({"hf", "llmc"}));
  auto* from = convert->add_option("--from", o.from, "Import format")->check(CLI::IsMember({"hf"}));
  to->excludes(from);
  convert
      ->add_option("--tokenizer", o.tokenizer,
                   "--to hf: the tokenizer to export instead of the one the checkpoint "
                   "carries (or, for older checkpoints, the recipe's)")
      ->check(CLI::ExistingFile);
  convert->add_flag("--overwrite", o.overwrite,
                    "Replace an existing export (--to hf: the directory's weights, config and "
                    "tokenizer files; --to llmc: the file)");
  convert->add_option("source", o.source, "Checkpoint directory (step-N), or HF directory")
      ->required();
  convert->add_option("destination", o.destination, "Output directory, file, or checkpoint root")
      ->required();
  commands.add(convert, [&o](const Job&) {
    std::string summary;
    if (o.to == "hf")
      summary = ckpt::export_hf(o.source, o.destination, o.overwrite, o.tokenizer);
    else if (o.to == "llmc")
      summary = ckpt::export_llmc(o.source, o.destination, o.overwrite);
    else if (o.from == "hf")
      summary = ckpt::import_hf(o.source, o.destination);
    else
      fail("ckpt convert needs --to hf|llmc or --from hf");
    std::puts(summary.c_str());
    return 0;
  });
}

}  // namespace

void add_ckpt_commands(Commands& commands) {
  CLI::App* ckpt = commands.app().add_subcommand("ckpt", "Checkpoint tools");
  ckpt->require_subcommand(1);
  add_inspect(commands, ckpt);
  add_convert(commands, ckpt);
}

}  // namespace pentad::cli
