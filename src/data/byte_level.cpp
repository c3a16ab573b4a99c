// GPT-2's byte alphabet and a strict UTF-8 character reader.
#include "data/byte_level.h"

#include <array>
#include <unordered_map>

namespace pentad::data {

namespace {

// Printable Latin-1 bytes stand for themselves, the other 68 bytes map to code points
// 256.. in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<uint32_t, uint8_t> from_codepoint;

  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      std::string utf8;
      if (cp < 0x80) {
        utf8.push_back(static_cast<char>(cp));
      } else {  // every stand-in is below U+0800: two bytes
        utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      to_unicode[b] = utf8;
      from_codepoint[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet instance;
  return instance;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) {
  return alphabet().to_unicode[byte];
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += alphabet().to_unicode[static_cast<uint8_t>(c)];
  return out;
}

bool from_byte_level(std::string_view text, std::string& bytes) {
  bytes.clear();
  const auto& table = alphabet().from_codepoint;
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<uint8_t>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    auto it = table.find(cp);
    if (it == table.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  return true;
}

int utf8_char_length(std::string_view text, size_t i) {
  const size_t n = text.size();
  auto at = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  auto cont = [&](size_t k, uint8_t lo, uint8_t hi) { return k < n && at(k) >= lo && at(k) <= hi; };
  const uint8_t c = at(i);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;  // no overlongs
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;             // nor surrogates
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

}  // namespace pentad::data
