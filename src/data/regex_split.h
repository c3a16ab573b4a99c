#pragma once
// Pre-tokenization by regular expression, as Hugging Face's Split(Regex, "Isolated") and
// ByteLevel(use_regex) do it: every match is a piece, and so is every stretch of text
// between matches. Patterns run through PCRE2 in UTF-8 + Unicode-property mode (\p{L},
// \s), JIT-compiled once; each thread matches with its own RegexScratch.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pentad::data {

// GPT-2's rule (ByteLevel's regex in Hugging Face tokenizers).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// LLaMA-3's rule (its tokenizer.json's Split pre-tokenizer).
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Match state of one thread for one RegexSplitter (PCRE2 match data and JIT stack).
class RegexScratch {
 public:
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class RegexSplitter;
  RegexScratch() = default;
  void* match_data_ = nullptr;  // pcre2_match_data_8*
  void* context_ = nullptr;     // pcre2_match_context_8*
  void* jit_stack_ = nullptr;   // pcre2_jit_stack_8*
};

class RegexSplitter {
 public:
  // `where` names the pattern's origin (file and field) in errors.
  RegexSplitter(const std::string& pattern, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  const std::string& pattern() const { return pattern_; }
  std::unique_ptr<RegexScratch> make_scratch() const;

  // Appends the pieces of `text` to `pieces` (empty pieces are dropped; together they
  // spell `text`). Bytes that are not valid UTF-8 become pieces of one byte each and the
  // pattern runs on the valid stretches between them.
  void split(std::string_view text, RegexScratch& scratch,
             std::vector<std::string_view>& pieces) const;

 private:
  void split_valid(std::string_view text, RegexScratch& scratch,
                   std::vector<std::string_view>& pieces) const;

  std::string pattern_, where_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// GPT-2's pre-tokenization of `text` (compiled once per process; any thread).
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace pentad::data
