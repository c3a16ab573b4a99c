#include "checkpoint/safetensors.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace pentad::ckpt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; pentad reads and writes it as host bytes");

namespace {

// Element sizes of the dtypes the safetensors format defines (byte-sized ones only).
size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal half: normalize the mantissa into a normal float.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    PENTAD_CHECK(numel == static_cast<int64_t>(t.data.size()), "{}: shape holds {} values, data {}",
                 t.name, numel, t.data.size());
    PENTAD_CHECK(!header.contains(t.name), "tensor {} written twice", t.name);
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot create ({})", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const NamedTensor& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data.data()),
                static_cast<std::streamsize>(t.data.size() * sizeof(float)));
    out.flush();
    if (!out) fail("{}: write failed ({})", tmp, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename {} into place ({})", path, tmp, ec.message());
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot read safetensors file ({})", path, ec.message());
  if (file_bytes < 8)
    fail("{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", path,
         file_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open ({})", path, std::strerror(errno));
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), sizeof(length));
  if (length > file_bytes - 8)
    fail(
        "{}: header length {} runs past the end of the file ({} bytes): not a safetensors file "
        "or truncated",
        path, length, file_bytes);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  if (!in) fail("{}: cannot read the {}-byte header", path, length);
  data_start_ = 8 + length;
  const uint64_t data_bytes = file_bytes - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: header is not valid JSON ({})", path, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", path);

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is not an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("{}: __metadata__.{} is not a string", path, m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const char* what) { fail("{}: tensor {}: {}", path, name, what); };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("no \"dtype\" string");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("no \"shape\" array");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      bad("no \"data_offsets\" [begin, end]");
    Entry e;
    e.dtype = v["dtype"].get<std::string>();
    const size_t size = dtype_size(e.dtype);
    if (size == 0)
      fail(
          "{}: tensor {}: unknown dtype \"{}\" (safetensors defines BOOL, U8, I8, F8_E5M2, "
          "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)",
          path, name, e.dtype);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad("shape holds something other than non-negative integers");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad("data_offsets are not non-negative integers");
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      fail("{}: tensor {}: data_offsets [{}, {}] out of range: the data section holds {} bytes",
           path, name, e.begin, e.end, data_bytes);
    if (e.end - e.begin != numel * size)
      fail("{}: tensor {}: data_offsets [{}, {}] hold {} bytes but {} of shape [{}] needs {}", path,
           name, e.begin, e.end, e.end - e.begin, e.dtype, fmt::join(e.shape, ", "), numel * size);
    ranges.emplace_back(e.begin, e.end);
    tensors_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fail("{}: tensors overlap in the data section (bytes {} to {})", path, ranges[i].first,
           ranges[i - 1].second);
}

std::vector<float> SafetensorsFile::read(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("{}: no tensor {}", path_, name);
  const Entry& e = it->second;
  const size_t size = dtype_size(e.dtype);
  if (e.dtype != "F32" && e.dtype != "F64" && e.dtype != "BF16" && e.dtype != "F16")
    fail("{}: tensor {} has dtype {}; pentad reads F32, F64, BF16 and F16", path_, name, e.dtype);
  const uint64_t bytes = e.end - e.begin;
  std::vector<char> raw(bytes);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  in.read(raw.data(), static_cast<std::streamsize>(bytes));
  if (!in) fail("{}: cannot read tensor {} ({} bytes)", path_, name, bytes);

  const size_t n = bytes / size;
  std::vector<float> out(n);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), bytes);
  } else if (e.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, raw.data() + i * 8, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    const bool bf16 = e.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + i * 2, 2);
      out[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

}  // namespace pentad::ckpt
