#include "data/corpus.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "data/token_files.h"
#include "data/tokenizer.h"

namespace pentad::data {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open text file", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

std::string content_hash(const std::string& path) {  // FNV-1a 64 of the file's bytes
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : read_text(path)) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return fmt::format("{:016x}", h);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

}  // namespace

std::vector<std::string> list_fortune_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail(
        "{}: fortune corpus not found; run scripts/setup.sh (it installs the Debian package "
        "`fortunes`), "
        "or point data.source / data.path at other data",
        dir);
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || ext == ".dat" || ext == ".u8")
      continue;  // also skips the "off" folder
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    fail("{}: no fortune files in the corpus directory; run scripts/setup.sh", dir);
  return files;
}

std::vector<std::string> split_fortunes(std::string_view text) {
  std::vector<std::string> docs;
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const size_t next = end == std::string_view::npos ? text.size() : end + 1;
    std::string_view line = text.substr(pos, next - pos);
    std::string_view bare = line.substr(0, line.find_first_of("\r\n"));
    if (bare == "%") {
      if (!is_blank(current)) docs.push_back(std::move(current));
      current.clear();
    } else {
      current.append(line);
    }
    pos = next;
  }
  if (!is_blank(current)) docs.push_back(std::move(current));
  return docs;
}

std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        bool fortune_format) {
  std::vector<std::string> docs;
  for (const auto& path : files) {
    std::string text = read_text(path);
    if (!fortune_format) {
      if (!text.empty()) docs.push_back(std::move(text));
      continue;
    }
    for (auto& doc : split_fortunes(text)) docs.push_back(std::move(doc));
  }
  return docs;
}

int64_t write_tokenized(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                        const std::string& prefix) {
  std::vector<std::string_view> views(documents.begin(), documents.end());
  std::vector<std::vector<int32_t>> encoded = tokenizer.encode_batch(views);
  MegatronWriter writer(prefix, smallest_token_dtype(tokenizer.vocab_size()));
  for (auto& ids : encoded) {
    if (tokenizer.eot_id() >= 0) ids.push_back(tokenizer.eot_id());
    writer.add_document(ids);
  }
  writer.finish();
  return writer.num_tokens();
}

std::string default_corpus_prefix(const DataConfig& cfg, int64_t vocab_size) {
  const std::string dir = cfg.cache_dir.empty() ? "." : cfg.cache_dir;
  if (!cfg.tokenizer.empty())
    return (fs::path(dir) / ("fortunes-" + content_hash(cfg.tokenizer))).string();
  return (fs::path(dir) / fmt::format("fortunes-bpe{}", vocab_size)).string();
}

std::string default_corpus_tokenizer(const DataConfig& cfg, int64_t vocab_size) {
  if (!cfg.tokenizer.empty()) return cfg.tokenizer;
  return default_corpus_prefix(cfg, vocab_size) + ".json";
}

std::string run_tokenizer(const DataConfig& cfg, int64_t vocab_size) {
  if (!cfg.tokenizer.empty() || cfg.source == "fortunes")
    return default_corpus_tokenizer(cfg, vocab_size);
  return "";
}

std::string prepare_default_corpus(const DataConfig& cfg, int64_t vocab_size,
                                   const std::string& corpus_dir) {
  const std::string prefix = default_corpus_prefix(cfg, vocab_size);
  const std::string tokenizer_path = default_corpus_tokenizer(cfg, vocab_size);
  if (exists(prefix + ".idx") && exists(prefix + ".bin") && exists(tokenizer_path)) return prefix;

  const std::vector<std::string> docs =
      read_documents(list_fortune_files(corpus_dir), /*fortune_format=*/true);
  std::error_code ec;
  fs::create_directories(fs::path(prefix).parent_path(), ec);
  if (ec)
    fail("{}: cannot create the data cache directory ({})", fs::path(prefix).parent_path().string(),
         ec.message());

  Tokenizer tokenizer;
  if (cfg.tokenizer.empty()) {
    spdlog::info("fortunes: learning a {}-token BPE tokenizer on {} documents from {}", vocab_size,
                 docs.size(), corpus_dir);
    std::vector<std::string_view> views(docs.begin(), docs.end());
    tokenizer = Tokenizer::train(views, vocab_size);
    tokenizer.save(tokenizer_path);
  } else {
    tokenizer = Tokenizer::load(cfg.tokenizer);
  }
  const int64_t tokens = write_tokenized(tokenizer, docs, prefix);
  spdlog::info("fortunes: {} documents, {} tokens -> {}.bin/.idx", docs.size(), tokens, prefix);
  return prefix;
}

}  // namespace pentad::data
