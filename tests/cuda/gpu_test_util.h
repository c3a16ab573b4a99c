#pragma once
// Device tensors for the GPU suite's kernel tests: allocation (one arena per tensor, so
// the sanitizer and the poison catch overruns), uploads from and downloads to float
// vectors in F32 or BF16, and NaN-poisoned outputs.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/device_memory.h"
#include "core/tensor.h"
#include "tests/kernels/kernel_test_util.h"

namespace pentad::testing {

class Gpu {
 public:
  Tensor alloc(Shape shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_bytes(dtype);
    arenas_.emplace_back("cuda test", std::max<size_t>(bytes, 1), Device::CUDA);
    return arenas_.back().alloc(shape, dtype);
  }
  // NaN in every element (0xff bytes are NaN in F32 and BF16): an unwritten output shows.
  Tensor poisoned(Shape shape, DType dtype) {
    Tensor t = alloc(shape, dtype);
    device_fill_ones(t.data, t.bytes());
    return t;
  }
  // values.size() must be shape.numel(); BF16 rounds them to nearest even.
  Tensor upload(const std::vector<float>& values, Shape shape, DType dtype) {
    PENTAD_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "test bug: {} values for {}",
                 values.size(), shape.numel());
    Tensor t = alloc(shape, dtype);
    if (dtype == DType::BF16) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
      copy_bytes(t.data, Device::CUDA, bits.data(), Device::CPU, t.bytes());
    } else {
      copy_bytes(t.data, Device::CUDA, values.data(), Device::CPU, t.bytes());
    }
    return t;
  }
  Tensor upload_ids(const std::vector<int32_t>& ids, Shape shape) {
    Tensor t = alloc(shape, DType::I32);
    copy_bytes(t.data, Device::CUDA, ids.data(), Device::CPU, t.bytes());
    return t;
  }
  // Standard normal values of the seed, in dtype.
  Tensor random(Shape shape, DType dtype, uint64_t seed) {
    return upload(to_float(randn(static_cast<size_t>(shape.numel()), seed)), shape, dtype);
  }
  Tensor clone(const Tensor& t) {
    Tensor c = alloc(t.shape, t.dtype);
    copy(c, t);
    return c;
  }

 private:
  std::deque<Arena> arenas_;
};

inline std::vector<float> download(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> bits(values.size());
    copy_bytes(bits.data(), Device::CPU, t.data, Device::CUDA, t.bytes());
    for (size_t i = 0; i < values.size(); ++i) values[i] = bf16_to_float(bits[i]);
  } else {
    copy_bytes(values.data(), Device::CPU, t.data, Device::CUDA, t.bytes());
  }
  return values;
}

}  // namespace pentad::testing
