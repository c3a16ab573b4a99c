#include "core/npy.h"

#include <fstream>

namespace pentad {

void write_npy(const std::string& path, const Tensor& t) {
  PENTAD_CHECK(t.device == Device::CPU, "write_npy needs a CPU tensor");
  const char* descr = t.dtype == DType::F32 ? "<f4" : t.dtype == DType::F64 ? "<f8" : "<i4";
  PENTAD_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64 || t.dtype == DType::I32,
               "write_npy: dtype {}", dtype_name(t.dtype));
  std::string shape;
  for (int i = 0; i < t.shape.ndim; ++i) shape += std::to_string(t.shape[i]) + ",";
  if (t.shape.ndim > 1) shape.pop_back();
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot write {}", path);
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header_len & 0xff));
  out.put(static_cast<char>(header_len >> 8));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes()));
  if (!out) fail("cannot write {}", path);
}

}  // namespace pentad
