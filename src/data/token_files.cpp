#include "data/token_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace pentad::data {

static_assert(std::endian::native == std::endian::little, "token files are read as little-endian");

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat ({})", path, std::strerror(err));
  }
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ > 0) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes ({})", path, bytes_, std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), bytes_);
}

// ---- dtypes ----

size_t token_dtype_bytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
    case TokenDType::I8:
      return 1;
    case TokenDType::I16:
    case TokenDType::U16:
      return 2;
    case TokenDType::I32:
      return 4;
    case TokenDType::I64:
      return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::U8:
      return "uint8";
    case TokenDType::I8:
      return "int8";
    case TokenDType::I16:
      return "int16";
    case TokenDType::U16:
      return "uint16";
    case TokenDType::I32:
      return "int32";
    case TokenDType::I64:
      return "int64";
  }
  return "?";
}

TokenDType smallest_token_dtype(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::U16 : TokenDType::I32;
}

int64_t read_token(const uint8_t* base, TokenDType dtype, int64_t i) {
  const uint8_t* p = base + static_cast<size_t>(i) * token_dtype_bytes(dtype);
  switch (dtype) {
    case TokenDType::U8:
      return *p;
    case TokenDType::I8:
      return static_cast<int8_t>(*p);
    case TokenDType::I16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case TokenDType::U16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case TokenDType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TokenDType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
  return 0;
}

namespace {

bool token_dtype_from_code(uint8_t code, TokenDType& dtype) {
  switch (code) {
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 8:
      dtype = static_cast<TokenDType>(code);
      return true;
    default:
      return false;
  }
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;

}  // namespace

// ---- Megatron ----

MegatronDataset MegatronDataset::open(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  if (::access(idx_path.c_str(), F_OK) != 0) {
    fail("{}: Megatron index file not found (data path is the prefix of a .bin/.idx pair)",
         idx_path);
  }
  MappedFile idx(idx_path);
  const uint8_t* p = idx.data();
  const size_t bytes = idx.bytes();
  if (bytes < 9 || std::memcmp(p, kMegatronMagic, 9) != 0) {
    fail("{}: bad magic: not a Megatron indexed-dataset index (expected \"MMIDIDX\")", idx_path);
  }
  if (bytes < kMegatronHeaderBytes)
    fail("{}: truncated index: {} bytes, the header alone is {}", idx_path, bytes,
         kMegatronHeaderBytes);
  const auto version = read_le<uint64_t>(p + 9);
  if (version != 1) fail("{}: unsupported index version {} (expected 1)", idx_path, version);
  const uint8_t code = p[17];
  MegatronDataset ds;
  if (!token_dtype_from_code(code, ds.dtype_)) {
    fail("{}: unknown dtype code {} (token files use 1=uint8, 3=int16, 4=int32, 8=uint16)",
         idx_path, code);
  }
  const auto n_seq = read_le<uint64_t>(p + 18);
  const auto n_doc = read_le<uint64_t>(p + 26);
  constexpr uint64_t kLimit = uint64_t{1} << 40;  // guards the size arithmetic below
  if (n_seq > kLimit || n_doc > kLimit)
    fail("{}: implausible counts ({} sequences, {} documents): corrupt header", idx_path, n_seq,
         n_doc);
  const uint64_t expected = kMegatronHeaderBytes + n_seq * (4 + 8) + n_doc * 8;
  if (bytes < expected) {
    fail("{}: truncated index: {} bytes, but {} sequences and {} document indices need {}",
         idx_path, bytes, n_seq, n_doc, expected);
  }
  if (bytes != expected && bytes != expected + n_seq) {  // + n_seq: multimodal sequence modes
    fail("{}: size mismatch: {} bytes, expected {} for {} sequences and {} document indices",
         idx_path, bytes, expected, n_seq, n_doc);
  }
  const uint8_t* q = p + kMegatronHeaderBytes;
  ds.sizes_.resize(n_seq);
  ds.pointers_.resize(n_seq);
  ds.document_indices_.resize(n_doc);
  std::memcpy(ds.sizes_.data(), q, n_seq * 4);
  std::memcpy(ds.pointers_.data(), q + n_seq * 4, n_seq * 8);
  std::memcpy(ds.document_indices_.data(), q + n_seq * 12, n_doc * 8);

  const auto& di = ds.document_indices_;
  if (di.empty() || di.front() != 0 || di.back() != static_cast<int64_t>(n_seq)) {
    fail("{}: corrupt document indices: must run from 0 to the sequence count {}", idx_path, n_seq);
  }
  for (size_t d = 1; d < di.size(); ++d) {
    if (di[d] < di[d - 1])
      fail("{}: corrupt document indices: entry {} ({}) is below entry {} ({})", idx_path, d, di[d],
           d - 1, di[d - 1]);
  }

  ds.bin_ = std::make_shared<MappedFile>(bin_path);
  const auto bin_bytes = static_cast<int64_t>(ds.bin_->bytes());
  const auto item = static_cast<int64_t>(token_dtype_bytes(ds.dtype_));
  int64_t end_of_data = 0;
  for (uint64_t s = 0; s < n_seq; ++s) {
    const int64_t size = ds.sizes_[s], ptr = ds.pointers_[s];
    if (size < 0 || ptr < 0)
      fail("{}: sequence {} has negative size or offset: corrupt index", idx_path, s);
    if (ptr + size * item > bin_bytes) {
      fail("{}: truncated data file: sequence {} ends at byte {} but the file has {} bytes",
           bin_path, s, ptr + size * item, bin_bytes);
    }
    ds.num_tokens_ += size;
    end_of_data = std::max(end_of_data, ptr + size * item);
  }
  if (end_of_data != bin_bytes) {
    fail("{}: size mismatch: the index describes {} bytes of {} tokens but the file has {} bytes",
         bin_path, end_of_data, token_dtype_name(ds.dtype_), bin_bytes);
  }
  return ds;
}

std::vector<int32_t> MegatronDataset::sequence(int64_t s) const {
  std::vector<int32_t> out(static_cast<size_t>(sequence_length(s)));
  const uint8_t* base = bin_->data() + sequence_pointer(s);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<int32_t>(read_token(base, dtype_, static_cast<int64_t>(i)));
  return out;
}

std::vector<int32_t> MegatronDataset::document(int64_t d) const {
  std::vector<int32_t> out;
  for (int64_t s = document_indices_[static_cast<size_t>(d)];
       s < document_indices_[static_cast<size_t>(d) + 1]; ++s) {
    auto seq = sequence(s);
    out.insert(out.end(), seq.begin(), seq.end());
  }
  return out;
}

std::string temporary_name(const std::string& path) {
  return fmt::format("{}.tmp.{}", path, ::getpid());
}

MegatronWriter::MegatronWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)),
      bin_tmp_(temporary_name(prefix_ + ".bin")),
      idx_tmp_(temporary_name(prefix_ + ".idx")),
      dtype_(dtype) {
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (bin_ == nullptr) fail("{}: cannot open for writing ({})", bin_tmp_, std::strerror(errno));
}

MegatronWriter::~MegatronWriter() {
  if (finished_) return;
  if (bin_ != nullptr) std::fclose(bin_);
  std::remove(bin_tmp_.c_str());
  std::remove(idx_tmp_.c_str());
}

void MegatronWriter::add_document(std::span<const int32_t> tokens) {
  PENTAD_CHECK(!finished_, "MegatronWriter used after finish()");
  const size_t item = token_dtype_bytes(dtype_);
  int64_t lo = 0, hi = std::numeric_limits<int32_t>::max();
  if (dtype_ == TokenDType::U8) hi = 255;
  if (dtype_ == TokenDType::I8) hi = 127;
  if (dtype_ == TokenDType::I16) hi = 32767;
  if (dtype_ == TokenDType::U16) hi = 65535;
  std::vector<uint8_t> buffer(tokens.size() * item);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < lo || t > hi)
      fail("{}: token id {} does not fit dtype {}", prefix_ + ".bin", t, token_dtype_name(dtype_));
    std::memcpy(buffer.data() + i * item, &t, item);  // little-endian: the low bytes
  }
  if (!buffer.empty() && std::fwrite(buffer.data(), 1, buffer.size(), bin_) != buffer.size()) {
    fail("{}: write failed ({})", bin_tmp_, std::strerror(errno));
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void MegatronWriter::finish() {
  PENTAD_CHECK(!finished_, "MegatronWriter finished twice");
  const int close_rc = std::fclose(bin_);
  bin_ = nullptr;
  if (close_rc != 0) fail("{}: write failed ({})", bin_tmp_, std::strerror(errno));

  const uint64_t n = sizes_.size();
  std::vector<uint8_t> idx(kMegatronHeaderBytes + n * 12 + (n + 1) * 8);
  uint8_t* p = idx.data();
  const uint64_t version = 1, n_doc = n + 1;
  std::memcpy(p, kMegatronMagic, 9);
  std::memcpy(p + 9, &version, 8);
  p[17] = static_cast<uint8_t>(dtype_);
  std::memcpy(p + 18, &n, 8);
  std::memcpy(p + 26, &n_doc, 8);
  uint8_t* q = p + kMegatronHeaderBytes;
  std::memcpy(q, sizes_.data(), n * 4);
  int64_t pointer = 0;
  for (uint64_t s = 0; s < n; ++s) {
    std::memcpy(q + n * 4 + s * 8, &pointer, 8);
    pointer += static_cast<int64_t>(sizes_[s]) * static_cast<int64_t>(token_dtype_bytes(dtype_));
  }
  for (uint64_t d = 0; d <= n; ++d) {
    const auto index = static_cast<int64_t>(d);  // one sequence per document
    std::memcpy(q + n * 12 + d * 8, &index, 8);
  }
  std::FILE* f = std::fopen(idx_tmp_.c_str(), "wb");
  if (f == nullptr) fail("{}: cannot open for writing ({})", idx_tmp_, std::strerror(errno));
  const bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size();
  if (std::fclose(f) != 0 || !ok) fail("{}: write failed ({})", idx_tmp_, std::strerror(errno));

  if (std::rename(bin_tmp_.c_str(), (prefix_ + ".bin").c_str()) != 0)
    fail("{}.bin: cannot rename into place ({})", prefix_, std::strerror(errno));
  if (std::rename(idx_tmp_.c_str(), (prefix_ + ".idx").c_str()) != 0)
    fail("{}.idx: cannot rename into place ({})", prefix_, std::strerror(errno));
  finished_ = true;
}

// ---- llm.c ----

LlmcShard LlmcShard::open(const std::string& path) {
  LlmcShard shard;
  shard.file_ = std::make_shared<MappedFile>(path);
  const uint8_t* p = shard.file_->data();
  const size_t bytes = shard.file_->bytes();
  constexpr size_t kHeaderBytes = kHeaderInts * 4;
  if (bytes < 4 || read_le<int32_t>(p) != kMagic) {
    fail("{}: bad magic: not an llm.c token shard (expected {} in the first int32)", path, kMagic);
  }
  if (bytes < kHeaderBytes)
    fail("{}: truncated: {} bytes, the llm.c header alone is {}", path, bytes, kHeaderBytes);
  const int32_t version = read_le<int32_t>(p + 4);
  if (version == 1) {
    shard.dtype_ = TokenDType::U16;
  } else if (version == 2) {
    shard.dtype_ = TokenDType::I32;
  } else {
    fail("{}: unsupported llm.c shard version {} (expected 1 = uint16 tokens, or 2 = uint32)", path,
         version);
  }
  const int64_t count = read_le<int32_t>(p + 8);
  const auto item = static_cast<int64_t>(token_dtype_bytes(shard.dtype_));
  const int64_t expected = static_cast<int64_t>(kHeaderBytes) + count * item;
  if (count < 0) fail("{}: negative token count {} in the header", path, count);
  if (static_cast<int64_t>(bytes) < expected) {
    fail("{}: truncated: header says {} tokens ({} bytes) but the file has {} bytes", path, count,
         expected, bytes);
  }
  if (static_cast<int64_t>(bytes) != expected) {
    fail("{}: size mismatch: header says {} tokens ({} bytes) but the file has {} bytes", path,
         count, expected, bytes);
  }
  shard.num_tokens_ = count;
  return shard;
}

void write_llmc_shard(const std::string& path, std::span<const int32_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("{}: too many tokens for one llm.c shard", path);
  std::vector<uint8_t> data(LlmcShard::kHeaderInts * 4 + tokens.size() * 2);
  std::vector<int32_t> header(LlmcShard::kHeaderInts, 0);
  header[0] = LlmcShard::kMagic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::memcpy(data.data(), header.data(), header.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 65535)
      fail("{}: token id {} does not fit an llm.c uint16 shard", path, tokens[i]);
    const auto t = static_cast<uint16_t>(tokens[i]);
    std::memcpy(data.data() + header.size() * 4 + i * 2, &t, 2);
  }
  write_file_atomically(path, data.data(), data.size());
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = temporary_name(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("{}: cannot open for writing ({})", tmp, std::strerror(errno));
  const bool ok = bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail("{}: write failed ({})", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("{}: cannot rename into place ({})", path, std::strerror(errno));
  }
}

}  // namespace pentad::data
