#pragma once
// The `tokenizer encode` and `tokenizer decode` CLI actions: documents as JSON Lines in,
// ids as lines of numbers out, and back; for scripts and for checking ids against other
// tokenizer libraries.
#include <iosfwd>
#include <string>

namespace pentad::data {

// Reads one document per line of `in` (a JSON string, or an object with a "text" string),
// encodes them all on every core and writes one line of space-separated ids per document.
// allow_special: special tokens written in the text become their ids. Prints the count,
// bytes and rate to stderr.
void tokenizer_encode(const std::string& tokenizer_file, bool allow_special, std::istream& in,
                      std::ostream& out);

// Reads lines of space-separated ids and writes each decoded document as a JSON string line.
void tokenizer_decode(const std::string& tokenizer_file, std::istream& in, std::ostream& out);

}  // namespace pentad::data
