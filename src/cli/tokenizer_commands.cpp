// The tokenizer encode / decode actions: JSON Lines in, ids out, and back.
#include "cli/tokenizer_commands.h"

#include <fmt/format.h>

#include <chrono>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

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
