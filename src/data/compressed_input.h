#pragma once
// A file read as a byte stream, decompressed on the way: zstd (suffix .zst or its magic
// bytes), gzip (zlib, which also passes plain files through unchanged) or plain.
#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace pentad::data {

class CompressedInput {
 public:
  explicit CompressedInput(std::string path);
  ~CompressedInput();
  CompressedInput(const CompressedInput&) = delete;
  CompressedInput& operator=(const CompressedInput&) = delete;

  // Up to `bytes` decompressed bytes into `out`; 0 at the end. Fails naming the file on a
  // read or decompression error (a truncated .zst included).
  size_t read(char* out, size_t bytes);
  int64_t compressed_bytes_read() const { return compressed_bytes_read_; }  // for progress
  const std::string& path() const { return path_; }

 private:
  size_t read_zstd(char* out, size_t bytes);

  std::string path_;
  gzFile gz_ = nullptr;
  std::FILE* raw_ = nullptr;  // zstd: the compressed file
  ZSTD_DCtx* zstd_ = nullptr;
  std::vector<char> zstd_in_;
  ZSTD_inBuffer zstd_in_view_{nullptr, 0, 0};
  bool zstd_frame_open_ = false;  // inside a frame: end of file here means truncation
  int64_t compressed_bytes_read_ = 0;
};

}  // namespace pentad::data
