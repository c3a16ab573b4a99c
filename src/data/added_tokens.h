#pragma once
// Added tokens (Hugging Face's added_tokens, SentencePiece's control symbols) found in
// text before pre-tokenization, as Hugging Face does it: leftmost-longest, the tokens
// matched on the raw text first (normalized = false), then the others in what is left.
// Special tokens are looked for only when the caller allows them; the others always.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pentad::data {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;
  bool normalized = false;  // matched after the raw-text pass
};

class AddedTokens {
 public:
  struct Segment {
    std::string_view text;  // empty when the segment is a token
    int32_t id = -1;        // the token's id, or -1 for text
  };

  AddedTokens() = default;
  explicit AddedTokens(std::vector<AddedToken> tokens);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  int32_t id_of(std::string_view content) const;  // -1 if absent
  // True when split() may find something in text under this allow_special.
  bool active(bool allow_special) const { return allow_special ? !tokens_.empty() : has_plain_; }
  // Cuts `text` into text segments and tokens, in order.
  void split(std::string_view text, bool allow_special, std::vector<Segment>& out) const;

 private:
  void split_pass(std::string_view text, bool allow_special, bool normalized,
                  std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;      // longest first
  bool has_plain_ = false;              // some token is not special
  std::array<bool, 256> first_byte_{};  // some token starts with this byte
};

}  // namespace pentad::data
