#include "data/document_stream.h"

#include <glob.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/compressed_input.h"

namespace pentad::data {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool has_wildcard(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

// "a.jsonl.gz" -> true: the format is named by the suffix under the compression suffix.
bool is_jsonl_name(std::string_view path) {
  if (ends_with(path, ".gz")) path.remove_suffix(3);
  if (ends_with(path, ".zst")) path.remove_suffix(4);
  return ends_with(path, ".jsonl") || ends_with(path, ".json") || ends_with(path, ".ndjson");
}

bool is_blank_text(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

}  // namespace

std::vector<std::string> expand_input_globs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (!has_wildcard(pattern)) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(pattern, ec))
        fail("{}: input file not found (or not a regular file)", pattern);
      files.push_back(pattern);
      continue;
    }
    glob_t matches{};
    const int rc = glob(pattern.c_str(), 0, nullptr, &matches);  // glob sorts its matches
    if (rc == GLOB_NOMATCH) {
      globfree(&matches);
      fail("{}: the glob matches no file (quote it so the shell does not expand it)", pattern);
    }
    if (rc != 0) {
      globfree(&matches);
      fail("{}: cannot expand the glob (glob error {})", pattern, rc);
    }
    for (size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
    globfree(&matches);
  }
  return files;
}

bool is_valid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t code = 0;
    if ((c & 0xE0) == 0xC0)
      len = 2, code = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, code = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, code = c & 0x07;
    else
      return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      code = (code << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 2 && code < 0x80) || (len == 3 && code < 0x800) || (len == 4 && code < 0x10000) ||
        code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

DocumentStream::DocumentStream(std::vector<std::string> files, DocumentStreamOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  for (const std::string& path : files_) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (!ec) input_bytes_total_ += static_cast<int64_t>(bytes);
  }
}

DocumentStream::~DocumentStream() = default;

int64_t DocumentStream::input_bytes_read() const {
  return input_bytes_done_ + (file_ ? file_->compressed_bytes_read() : 0);
}

bool DocumentStream::open_next_file() {
  if (file_ != nullptr) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(file_->path(), ec);
    if (!ec) input_bytes_done_ += static_cast<int64_t>(bytes);
  }
  file_.reset();
  if (file_index_ >= files_.size()) return false;
  const std::string& path = files_[file_index_++];
  file_ = std::make_unique<CompressedInput>(path);
  jsonl_ = is_jsonl_name(path);
  line_ = 0;
  pending_.clear();
  pending_pos_ = 0;
  eof_ = false;
  return true;
}

bool DocumentStream::read_line(std::string& line) {
  line.clear();
  while (true) {
    const size_t nl = pending_.find('\n', pending_pos_);
    if (nl != std::string::npos) {
      line.append(pending_, pending_pos_, nl - pending_pos_);
      pending_pos_ = nl + 1;
      ++line_;
      line_had_newline_ = true;
      return true;
    }
    line.append(pending_, pending_pos_, std::string::npos);
    pending_.clear();
    pending_pos_ = 0;
    if (eof_) {
      if (line.empty()) return false;
      ++line_;
      line_had_newline_ = false;
      return true;
    }
    pending_.resize(1 << 20);
    const size_t got = file_->read(pending_.data(), pending_.size());
    pending_.resize(got);
    if (got == 0) eof_ = true;
  }
}

void DocumentStream::bad(const std::string& what) {
  bad_at(line_, what);
}

void DocumentStream::bad_at(int64_t line, const std::string& what) {
  const std::string where = fmt::format("{}:{}", files_[file_index_ - 1], line);
  if (!options_.skip_bad) fail("{}: {} (pass --skip-bad to skip such lines)", where, what);
  ++bad_documents_;
  spdlog::warn("{}: {}; skipped", where, what);
}

bool DocumentStream::next_jsonl(std::string& doc) {
  std::string line;
  while (read_line(line)) {
    if (is_blank_text(line)) continue;
    // nlohmann's parser rejects ill-formed UTF-8 inside strings, so one parse checks both.
    nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      bad(is_valid_utf8(line) ? "not a JSON value" : "invalid UTF-8");
      continue;
    }
    if (!value.is_object() || !value.contains(options_.json_key)) {
      bad(fmt::format("no key \"{}\" (choose another with --json-key)", options_.json_key));
      continue;
    }
    const nlohmann::json& text = value[options_.json_key];
    if (!text.is_string()) {
      bad(fmt::format("\"{}\" is {}, not a string", options_.json_key, text.type_name()));
      continue;
    }
    doc = text.get<std::string>();
    if (doc.empty()) {
      ++empty_texts_;
      continue;
    }
    return true;
  }
  return false;
}

bool DocumentStream::next_fortune(std::string& doc) {
  doc.clear();
  std::string line;
  int64_t first_line = line_ + 1;
  while (read_line(line)) {
    std::string_view bare(line);
    if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
    if (bare == "%") {
      if (!is_blank_text(doc)) {
        if (is_valid_utf8(doc)) return true;
        bad_at(first_line, "invalid UTF-8 in the document starting here");
      }
      doc.clear();
      first_line = line_ + 1;
      continue;
    }
    doc.append(line);
    if (line_had_newline_) doc.push_back('\n');
  }
  if (!is_blank_text(doc)) {
    if (is_valid_utf8(doc)) return true;
    bad_at(first_line, "invalid UTF-8 in the document starting here");
  }
  return false;
}

bool DocumentStream::next_whole_file(std::string& doc) {
  if (eof_) return false;
  doc.clear();
  std::string chunk(1 << 20, '\0');
  while (true) {
    const size_t got = file_->read(chunk.data(), chunk.size());
    if (got == 0) break;
    doc.append(chunk, 0, got);
  }
  eof_ = true;
  if (doc.empty()) return false;
  if (!is_valid_utf8(doc)) {
    bad_at(1, "invalid UTF-8 in the file");
    return false;
  }
  return true;
}

bool DocumentStream::next(std::string& doc) {
  while (true) {
    if (file_ == nullptr && !open_next_file()) return false;
    bool got = false;
    if (jsonl_)
      got = next_jsonl(doc);
    else if (options_.fortune_format)
      got = next_fortune(doc);
    else
      got = next_whole_file(doc);
    if (got) return true;
    if (!open_next_file()) return false;
  }
}

}  // namespace pentad::data
