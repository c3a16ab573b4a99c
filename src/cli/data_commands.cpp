#include "cli/data_commands.h"

#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>

#include "cli/command.h"
#include "core/check.h"
#include "core/progress.h"
#include "data/corpus.h"
#include "data/document_stream.h"
#include "data/token_files.h"
#include "data/tokenizer.h"

namespace pentad::data {

void tokenizer_train(const std::vector<std::string>& text_files, int64_t vocab_size,
                     const std::string& out_json) {
  if (text_files.empty()) fail("tokenizer train: no text files given");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> docs = read_documents(text_files, /*fortune_format=*/false);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const Tokenizer tokenizer = Tokenizer::train(views, vocab_size, /*progress=*/true);
  // Merging stops where no pair of tokens repeats: a vocabulary short of the size asked for
  // would not fit the model.vocab_size it was asked for, so nothing is written.
  if (tokenizer.vocab_size() < vocab_size)
    fail(
        "tokenizer train: the text gives {} tokens, not the {} of --vocab-size: after {} merges "
        "no pair of tokens occurs twice ({} bytes of text). Give more text, or --vocab-size {} "
        "or less; {} not written",
        tokenizer.vocab_size(), vocab_size, tokenizer.num_merges(), bytes, tokenizer.vocab_size(),
        out_json);
  tokenizer.save(out_json);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("tokenizer train: {} files, {} bytes -> {} tokens ({} merges), wrote {} in {:.1f} s\n",
             text_files.size(), bytes, tokenizer.vocab_size(), tokenizer.num_merges(), out_json,
             seconds);
}

namespace {

// The id of the token whose content is `content`, or -1. A scan through the public API,
// once per run, keeps the tokenizer's interface unchanged.
int32_t find_token_id(const Tokenizer& tokenizer, std::string_view content) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.token_bytes(id) == content) return id;
  return -1;
}

int32_t boundary_token(const Tokenizer& tokenizer, const std::string& content,
                       const std::string& flag, const std::string& tokenizer_json) {
  const int32_t id = find_token_id(tokenizer, content);
  if (id < 0)
    fail("{}: the tokenizer has no token \"{}\" for {}; name one it has", tokenizer_json, content,
         flag);
  return id;
}

}  // namespace

void data_prepare(const PrepareOptions& options) {
  if (options.inputs.empty()) fail("data prepare: no input files given");
  const std::vector<std::string> files = expand_input_globs(options.inputs);
  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer_json);
  const int32_t eod_id =
      options.eod.empty() ? tokenizer.eot_id()
                          : boundary_token(tokenizer, options.eod, "--eod", options.tokenizer_json);
  const int32_t bos_id =
      options.bos.empty() ? -1
                          : boundary_token(tokenizer, options.bos, "--bos", options.tokenizer_json);

  const auto start = std::chrono::steady_clock::now();
  DocumentStream stream(files, {options.fortune_format, options.json_key, options.skip_bad});
  MegatronWriter writer(options.out_prefix, smallest_token_dtype(tokenizer.vocab_size()));
  // Batches of documents (options.batch_bytes of text), each encoded on every thread and
  // written in input order, so the output depends neither on the thread count nor on the
  // batch size. One batch is encoded and written on a worker while this thread reads and
  // parses the next, so memory stays at two batches.
  std::vector<std::string> batch;
  size_t batch_bytes = 0, input_bytes = 0;
  std::atomic<int64_t> tokens_written{0};
  auto encode_and_write = [&](const std::vector<std::string>& docs) {
    // The thread count is an OpenMP setting of the thread that encodes: this worker's.
    if (options.threads > 0) omp_set_num_threads(options.threads);
    std::vector<std::string_view> views(docs.begin(), docs.end());
    std::vector<std::vector<int32_t>> encoded = tokenizer.encode_batch(views);
    std::vector<int32_t> ids;
    for (const auto& doc_ids : encoded) {
      ids.clear();
      if (bos_id >= 0) ids.push_back(bos_id);
      ids.insert(ids.end(), doc_ids.begin(), doc_ids.end());
      if (eod_id >= 0) ids.push_back(eod_id);
      writer.add_document(ids);
    }
    tokens_written = writer.num_tokens();
  };
  std::future<void> in_flight;  // the batch being encoded and written; declared after what it uses
  auto flush = [&] {
    if (in_flight.valid()) in_flight.get();  // rethrows the worker's error
    in_flight = std::async(std::launch::async, encode_and_write, std::move(batch));
    batch = {};
    batch_bytes = 0;
  };
  Progress progress("data prepare", stream.input_bytes_total());
  int64_t documents_read = 0;
  std::string doc;
  while (stream.next(doc)) {
    ++documents_read;
    if (progress.due())
      progress.show(stream.input_bytes_read(),
                    fmt::format("{} documents, {} tokens", documents_read, tokens_written.load()));
    batch_bytes += doc.size();
    input_bytes += doc.size();
    batch.push_back(std::move(doc));
    doc = std::string();
    if (batch_bytes >= options.batch_bytes) flush();
  }
  if (!batch.empty()) flush();
  if (in_flight.valid()) in_flight.get();
  progress.finish();
  if (writer.num_documents() == 0)
    fail("data prepare: the {} input files hold no documents", files.size());
  writer.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string empty =
      stream.empty_texts() > 0 ? fmt::format(", {} empty texts skipped", stream.empty_texts()) : "";
  fmt::print(
      "data prepare: {} files, {} documents, {} tokens, {} bad lines skipped{} -> {}.bin, {}.idx "
      "({:.1f} MB/s)\n",
      files.size(), writer.num_documents(), writer.num_tokens(), stream.bad_documents(), empty,
      options.out_prefix, options.out_prefix, input_bytes / 1e6 / std::max(seconds, 1e-9));
}

}  // namespace pentad::data

namespace pentad::cli {

void add_data_commands(Commands& commands) {
  CLI::App* data = commands.app().add_subcommand("data", "Data preparation");
  data->require_subcommand(1);
  auto& prep = commands.keep<data::PrepareOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Tokenize text files into a Megatron indexed dataset (PREFIX.bin + PREFIX.idx)");
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
  commands.add(prepare, [&prep](const Job&) {
    data::data_prepare(prep);
    return 0;
  });
}

}  // namespace pentad::cli
