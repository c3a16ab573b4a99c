#pragma once
// SHA-256 (FIPS 180-4) of a byte string, as `sha256sum` prints it: 64 lowercase hex digits.
// A checkpoint records the sha256 of the tokenizer it carries (Manifest::tokenizer_sha256),
// the hash users compare with a published tokenizer's; shards keep the faster xxh3-64.
#include <string>
#include <string_view>

namespace pentad::ckpt {

std::string sha256_hex(std::string_view bytes);

}  // namespace pentad::ckpt
