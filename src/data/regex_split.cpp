// PCRE2 behind RegexSplitter: compile with UTF + UCP (Unicode classes for \p, \s, \d, as
// the Oniguruma engine of Hugging Face tokenizers has them), JIT where the CPU allows.
#include "data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"
#include "data/byte_level.h"

namespace pentad::data {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& where)
    : pattern_(pattern), where_(where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr)
    fail("{}: the pattern {} does not compile with PCRE2 at offset {}: {}", where, pattern, offset,
         pcre2_message(error));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
  code_ = code;
}

RegexSplitter::~RegexSplitter() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::unique_ptr<RegexScratch> RegexSplitter::make_scratch() const {
  std::unique_ptr<RegexScratch> s(new RegexScratch());
  s->match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code_), nullptr);
  auto* context = pcre2_match_context_create(nullptr);
  // JIT's default 32 KiB stack can run out on long runs of one class; 1 MiB never has.
  auto* stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  if (s->match_data_ == nullptr || context == nullptr || stack == nullptr)
    fail("{}: out of memory for PCRE2 match data", where_);
  pcre2_jit_stack_assign(context, nullptr, stack);
  s->context_ = context;
  s->jit_stack_ = stack;
  return s;
}

void RegexSplitter::split(std::string_view text, RegexScratch& scratch,
                          std::vector<std::string_view>& pieces) const {
  size_t start = 0;  // of the current valid stretch
  for (size_t i = 0; i < text.size();) {
    const int length = utf8_char_length(text, i);
    if (length > 0) {
      i += static_cast<size_t>(length);
      continue;
    }
    split_valid(text.substr(start, i - start), scratch, pieces);
    pieces.push_back(text.substr(i, 1));
    start = ++i;
  }
  split_valid(text.substr(start), scratch, pieces);
}

void RegexSplitter::split_valid(std::string_view text, RegexScratch& scratch,
                                std::vector<std::string_view>& pieces) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* match = static_cast<pcre2_match_data*>(scratch.match_data_);
  auto* context = static_cast<pcre2_match_context*>(scratch.context_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap = 0;  // end of the last match: text from here to the next match is a piece
  size_t from = 0;
  while (from < text.size()) {
    const int rc =
        pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, match, context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("{}: matching the pattern {} failed: {}", where_, pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {  // an empty match is no piece: search again one character on
      from = begin + static_cast<size_t>(utf8_char_length(text, begin));
      continue;
    }
    if (begin > gap) pieces.push_back(text.substr(gap, begin - gap));
    pieces.push_back(text.substr(begin, end - begin));
    gap = from = end;
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  static const RegexSplitter gpt2(kGpt2Pattern, "GPT-2 pre-tokenizer");
  thread_local std::unique_ptr<RegexScratch> scratch = gpt2.make_scratch();
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);
  gpt2.split(text, *scratch, pieces);
  return pieces;
}

}  // namespace pentad::data
