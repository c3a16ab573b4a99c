#pragma once
// GPT-2's byte-level alphabet: every byte has a printable stand-in character ("Ġ" for ' '),
// so that a byte-level BPE vocabulary is a map of printable strings (tokenizer.json).
#include <cstdint>
#include <string>
#include <string_view>

namespace pentad::data {

// byte -> UTF-8 of its printable stand-in (bytes_to_unicode in GPT-2's encoder.py).
const std::string& byte_to_unicode(uint8_t byte);
// Raw bytes -> their stand-ins.
std::string to_byte_level(std::string_view bytes);
// Stand-ins -> raw bytes; false if `text` has a character outside the alphabet.
bool from_byte_level(std::string_view text, std::string& bytes);

// Length of the valid UTF-8 character starting at text[i] (1 to 4), or 0 if the bytes there
// are not one (overlong, surrogate, above U+10FFFF, truncated): what PCRE2 calls invalid.
int utf8_char_length(std::string_view text, size_t i);

}  // namespace pentad::data
