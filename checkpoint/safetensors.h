#pragma once
// Safetensors files (Hugging Face's weight format), the exchange format of `pentad ckpt
// convert`. Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>"}}   (optional)
// then the raw little-endian tensor bytes; offsets are relative to the end of the header.
// pentad writes F32 only and reads F32, F64, BF16 and F16, converting to f32.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pentad::ckpt {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, numel(shape) values
};

// Writes `tensors` (in the given order, F32) and `metadata` to path, through path.tmp and
// a rename, so a failed write never leaves a half file under the final name. The header
// is padded with spaces to a multiple of 8 bytes, as the reference writer does.
// Throws pentad::Error naming the file on any I/O failure.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;  // as stored: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
  };

  // Reads and validates the header table: every entry well formed, a dtype safetensors
  // defines, a byte range inside the file whose length matches its shape. Throws
  // pentad::Error naming the file and the problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  // Tensor `name` as f32 (F32, F64, BF16 and F16 are converted; other dtypes, such as the
  // I64 buffers some models carry, throw pentad::Error naming the file and tensor).
  std::vector<float> read(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pentad::ckpt
