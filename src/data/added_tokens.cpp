// Leftmost-longest search for added tokens. Vocabularies have a few hundred of them at most,
// so a first-byte filter and a longest-first scan at each candidate position are enough.
#include "data/added_tokens.h"

#include <algorithm>

namespace pentad::data {

AddedTokens::AddedTokens(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  tokens_.erase(std::remove_if(tokens_.begin(), tokens_.end(),
                               [](const AddedToken& t) { return t.content.empty(); }),
                tokens_.end());
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& t : tokens_) {
    has_plain_ = has_plain_ || !t.special;
    first_byte_[static_cast<uint8_t>(t.content[0])] = true;
  }
}

int32_t AddedTokens::id_of(std::string_view content) const {
  for (const AddedToken& t : tokens_)
    if (t.content == content) return t.id;
  return -1;
}

void AddedTokens::split(std::string_view text, bool allow_special,
                        std::vector<Segment>& out) const {
  if (!active(allow_special)) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  std::vector<Segment> raw;
  split_pass(text, allow_special, /*normalized=*/false, raw);
  for (const Segment& s : raw) {
    if (s.id >= 0)
      out.push_back(s);
    else
      split_pass(s.text, allow_special, /*normalized=*/true, out);
  }
}

void AddedTokens::split_pass(std::string_view text, bool allow_special, bool normalized,
                             std::vector<Segment>& out) const {
  size_t gap = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    for (const AddedToken& t : tokens_) {  // longest first: the first match is the longest
      if (t.normalized != normalized || (t.special && !allow_special)) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > gap) out.push_back({text.substr(gap, i - gap), -1});
    out.push_back({std::string_view(), found->id});
    i += found->content.size();
    gap = i;
  }
  if (gap < text.size()) out.push_back({text.substr(gap), -1});
}

}  // namespace pentad::data
