#pragma once
// Token files on disk, read through mmap:
//  - Megatron indexed datasets (prefix.bin + prefix.idx, the "MMIDIDX" format of
//    Megatron-LM's indexed_dataset.py):
//      idx: "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code | u64 sequence_count |
//           u64 document_count | i32 sizes[sequence_count] | i64 pointers[sequence_count]
//           (byte offsets into .bin) | i64 document_indices[document_count]
//      document_indices starts at 0 and ends at sequence_count: document d is sequences
//      [document_indices[d], document_indices[d+1]), so there are document_count - 1 documents.
//  - llm.c shards: 256 int32 header (magic 20240520, version 1 = uint16 tokens, token
//    count) followed by the tokens.
// Files are little-endian, as on every machine pentad runs on.
// Every reader check names the file and the problem, since these come from users.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pentad::data {

// A read-only memory map of a whole file (empty files map to nullptr, size 0).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// Megatron dtype codes (indexed_dataset.py DType). Only integer types hold tokens.
enum class TokenDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, U16 = 8 };
size_t token_dtype_bytes(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);
TokenDType smallest_token_dtype(int64_t vocab_size);  // uint16 below 65536, else int32

// Reads token `i` of a packed array of `dtype` as int64 (unaligned-safe).
int64_t read_token(const uint8_t* base, TokenDType dtype, int64_t i);

class MegatronDataset {
 public:
  static MegatronDataset open(const std::string& prefix);  // prefix.idx + prefix.bin

  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t sequence_length(int64_t s) const { return sizes_[static_cast<size_t>(s)]; }
  int64_t sequence_pointer(int64_t s) const { return pointers_[static_cast<size_t>(s)]; }  // bytes
  std::span<const int64_t> document_indices() const { return document_indices_; }
  const uint8_t* bin_data() const { return bin_->data(); }
  const std::string& bin_path() const { return bin_->path(); }
  std::shared_ptr<const MappedFile> bin_file() const { return bin_; }
  std::vector<int32_t> sequence(int64_t s) const;  // decoded copy
  std::vector<int32_t> document(int64_t d) const;  // all its sequences, concatenated

 private:
  TokenDType dtype_ = TokenDType::U16;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_;
  int64_t num_tokens_ = 0;
  std::shared_ptr<const MappedFile> bin_;
};

// Writes prefix.bin/.idx, one sequence per document. Writes to temporary names and
// renames in finish() (.bin first, then .idx), so a reader that sees prefix.idx sees a
// complete pair, and an interrupted writer leaves no half file under the final names.
class MegatronWriter {
 public:
  MegatronWriter(std::string prefix, TokenDType dtype);
  ~MegatronWriter();  // removes the temporaries if finish() was never called
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;

  void add_document(std::span<const int32_t> tokens);  // fails if a token does not fit dtype
  void finish();
  int64_t num_documents() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_, bin_tmp_, idx_tmp_;
  TokenDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  int64_t num_tokens_ = 0;
  bool finished_ = false;
};

class LlmcShard {
 public:
  static constexpr int32_t kMagic = 20240520;
  static constexpr int kHeaderInts = 256;

  static LlmcShard open(const std::string& path);
  int64_t num_tokens() const { return num_tokens_; }
  TokenDType dtype() const {
    return dtype_;
  }  // version 1: uint16; version 2 (llm.c llama3): uint32
  const uint8_t* token_data() const { return file_->data() + kHeaderInts * 4; }
  std::shared_ptr<const MappedFile> file() const { return file_; }
  const std::string& path() const { return file_->path(); }

 private:
  int64_t num_tokens_ = 0;
  TokenDType dtype_ = TokenDType::U16;
  std::shared_ptr<const MappedFile> file_;
};

void write_llmc_shard(const std::string& path, std::span<const int32_t> tokens);  // tokens < 65536

// Writes a file through a temporary name and a rename, so it appears whole or not at all.
void write_file_atomically(const std::string& path, const void* data, size_t bytes);
std::string temporary_name(const std::string& path);  // path + ".tmp.<pid>"

}  // namespace pentad::data
