#pragma once
// Cheap seeded pseudo-random floats for tests that fill millions of values. The standard
// library's normal distribution costs a logarithm and a cosine per value, which the
// unoptimised test code of the AddressSanitizer build turned into 10 s a test (AdamW's and the
// checkpoint saver's tests: three quarters of their time in std::normal_distribution).
#include <cstdint>
#include <vector>

namespace pentad {

// Values spread over [-scale, scale), a function of (seed, index) only: the top 24 bits of a
// splitmix64 hash of the two. Not normal, but varied in sign, exponent and mantissa bits,
// which is all the tests using it need.
inline float fast_random_value(uint64_t seed, uint64_t index, float scale) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

inline void fast_random_fill(float* out, size_t n, uint64_t seed, float scale = 1.0f) {
  for (size_t i = 0; i < n; ++i) out[i] = fast_random_value(seed, i, scale);
}

inline std::vector<float> fast_random(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> out(n);
  fast_random_fill(out.data(), n, seed, scale);
  return out;
}

}  // namespace pentad
