// The tokenizer encode / decode actions: JSON Lines in, ids out, and back.
#include "cli/tokenizer_commands.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "cli/command.h"
#include "cli/data_commands.h"
#include "core/check.h"
#include "data/tokenizer.h"

namespace pentad::data {

void tokenizer_encode(const std::string& tokenizer_file, bool allow_special, std::istream& in,
                      std::ostream& out) {
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_file);
  std::vector<std::string> docs;
  std::string line;
  size_t bytes = 0;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(
          "tokenizer encode: input line {} is not JSON ({}); give one JSON string or "
          "{{\"text\": ...}} object per line",
          number, e.what());
    }
    if (value.is_object() && value.contains("text")) value = value["text"];
    if (!value.is_string())
      fail(
          "tokenizer encode: input line {} is neither a JSON string nor an object with a "
          "\"text\" string",
          number);
    docs.push_back(value.get<std::string>());
    bytes += docs.back().size();
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const auto encoded = tokenizer.encode_batch(views, allow_special);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t tokens = 0;
  std::string text;
  for (const auto& ids : encoded) {
    text.clear();
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k > 0) text.push_back(' ');
      text += std::to_string(ids[k]);
    }
    text.push_back('\n');
    out << text;
    tokens += ids.size();
  }
  out.flush();
  if (!out) fail("tokenizer encode: writing the ids failed");
  fmt::print(stderr,
             "tokenizer encode: {} documents, {} bytes -> {} tokens in {:.3f} s ({:.1f} MB/s, {} "
             "from {})\n",
             docs.size(), bytes, tokens, seconds, seconds > 0 ? bytes / seconds / 1e6 : 0.0,
             tokenizer.kind(), tokenizer_file);
}

void tokenizer_decode(const std::string& tokenizer_file, std::istream& in, std::ostream& out) {
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_file);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::vector<int32_t> ids;
    std::string field;
    while (fields >> field) {
      try {
        size_t used = 0;
        const long long id = std::stoll(field, &used);
        if (used != field.size()) throw std::invalid_argument(field);
        ids.push_back(static_cast<int32_t>(id));
      } catch (const std::logic_error&) {
        fail("tokenizer decode: line {} has \"{}\", which is not a token id", number, field);
      }
    }
    out << nlohmann::json(tokenizer.decode(ids))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
        << "\n";
  }
  out.flush();
  if (!out) fail("tokenizer decode: writing the text failed");
}

}  // namespace pentad::data

namespace pentad::cli {

void add_tokenizer_commands(Commands& commands) {
  CLI::App* tok = commands.app().add_subcommand("tokenizer", "Tokenizers");
  tok->require_subcommand(1);
  struct Options {
    std::vector<std::string> inputs;
    int64_t vocab_size = 8192;
    std::string out, tokenizer;
    bool allow_special = false;
  };
  auto& o = commands.keep<Options>();
  CLI::App* train =
      tok->add_subcommand("train", "Learn a byte-level BPE vocabulary from text files");
  train->add_option("inputs", o.inputs, "Text files")->required()->check(CLI::ExistingFile);
  train->add_option("-v,--vocab-size", o.vocab_size, "Vocabulary size, <|endoftext|> included")
      ->capture_default_str();
  train->add_option("-o,--out", o.out, "Output tokenizer.json")->required();
  commands.add(train, [&o](const Job&) {
    data::tokenizer_train(o.inputs, o.vocab_size, o.out);
    return 0;
  });
  CLI::App* encode = tok->add_subcommand(
      "encode",
      "Encode documents from stdin, one per line as a JSON string or {\"text\": ...}; writes "
      "one line of space-separated ids per document");
  encode->add_option("tokenizer", o.tokenizer, "tokenizer.json or tokenizer.model")
      ->required()
      ->check(CLI::ExistingFile);
  encode->add_flag("--special", o.allow_special,
                   "Special tokens written in the text (\"<|endoftext|>\") become their ids; "
                   "by default they stay text");
  commands.add(encode, [&o](const Job&) {
    data::tokenizer_encode(o.tokenizer, o.allow_special, std::cin, std::cout);
    return 0;
  });
  CLI::App* decode = tok->add_subcommand(
      "decode", "Decode lines of space-separated ids from stdin; writes one JSON string per line");
  decode->add_option("tokenizer", o.tokenizer, "tokenizer.json or tokenizer.model")
      ->required()
      ->check(CLI::ExistingFile);
  commands.add(decode, [&o](const Job&) {
    data::tokenizer_decode(o.tokenizer, std::cin, std::cout);
    return 0;
  });
}

}  // namespace pentad::cli
