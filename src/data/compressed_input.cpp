#include "data/compressed_input.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace pentad::data {

namespace {

bool has_zstd_magic(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char magic[4] = {0, 0, 0, 0};
  const size_t got = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return got == 4 && magic[0] == 0x28 && magic[1] == 0xB5 && magic[2] == 0x2F && magic[3] == 0xFD;
}

bool is_zst_name(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".zst") == 0;
}

}  // namespace

CompressedInput::CompressedInput(std::string path) : path_(std::move(path)) {
  if (is_zst_name(path_) || has_zstd_magic(path_)) {
    raw_ = std::fopen(path_.c_str(), "rb");
    if (raw_ == nullptr) fail("{}: cannot open input file ({})", path_, std::strerror(errno));
    zstd_ = ZSTD_createDCtx();
    PENTAD_CHECK(zstd_ != nullptr, "ZSTD_createDCtx failed");
    zstd_in_.resize(ZSTD_DStreamInSize());
    return;
  }
  gz_ = gzopen(path_.c_str(), "rb");
  if (gz_ == nullptr) fail("{}: cannot open input file ({})", path_, std::strerror(errno));
  gzbuffer(gz_, 1 << 20);
}

CompressedInput::~CompressedInput() {
  if (gz_ != nullptr) gzclose(gz_);
  if (raw_ != nullptr) std::fclose(raw_);
  if (zstd_ != nullptr) ZSTD_freeDCtx(zstd_);
}

size_t CompressedInput::read(char* out, size_t bytes) {
  if (zstd_ != nullptr) return read_zstd(out, bytes);
  const int got = gzread(gz_, out, static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30)));
  if (got < 0) {
    int errnum = 0;
    fail("{}: read or gzip decompression failed ({})", path_, gzerror(gz_, &errnum));
  }
  compressed_bytes_read_ = gzoffset(gz_);
  return static_cast<size_t>(got);
}

size_t CompressedInput::read_zstd(char* out, size_t bytes) {
  ZSTD_outBuffer output{out, bytes, 0};
  while (true) {
    // Decompress first, even with no new input: the context may still hold output.
    if (zstd_frame_open_ || zstd_in_view_.pos < zstd_in_view_.size) {
      const size_t rc = ZSTD_decompressStream(zstd_, &output, &zstd_in_view_);
      if (ZSTD_isError(rc))
        fail("{}: zstd decompression failed ({})", path_, ZSTD_getErrorName(rc));
      zstd_frame_open_ = rc != 0;  // 0: a frame ended and was flushed whole
      if (output.pos > 0) return output.pos;
    }
    if (zstd_in_view_.pos < zstd_in_view_.size) continue;
    const size_t got = std::fread(zstd_in_.data(), 1, zstd_in_.size(), raw_);
    if (got == 0) {
      if (std::ferror(raw_)) fail("{}: read failed ({})", path_, std::strerror(errno));
      if (zstd_frame_open_) fail("{}: the zstd stream ends inside a frame (truncated?)", path_);
      return 0;
    }
    compressed_bytes_read_ += static_cast<int64_t>(got);
    zstd_in_view_ = {zstd_in_.data(), got, 0};
  }
}

}  // namespace pentad::data
