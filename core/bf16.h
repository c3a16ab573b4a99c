#pragma once
// bfloat16 on the host: the top 16 bits of an IEEE float. Host code (CPU conversion, tests)
// stores bf16 tensors as uint16_t; CUDA kernels use __nv_bfloat16, which has the same bits
// and the same round-to-nearest-even conversion.
#include <bit>
#include <cstdint>

namespace pentad {

inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest, ties to even. NaN stays NaN (quieted); overflow rounds to infinity.
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace pentad
