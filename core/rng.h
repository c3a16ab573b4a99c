#pragma once
// Counter-based random numbers: the value at (key, index) depends on nothing else, so a
// rank holding any slice of a tensor draws exactly the slice of the one-rank tensor, and
// results are the same on every platform and thread count.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace pentad {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash_string(std::string_view s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1): 53 random bits, never exactly 0.
inline double uniform_at(uint64_t key, uint64_t index) {
  uint64_t bits = splitmix64(key ^ splitmix64(index));
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal via Box-Muller on two independent uniforms.
inline double normal_at(uint64_t key, uint64_t index) {
  double u1 = uniform_at(key, 2 * index);
  double u2 = uniform_at(key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace pentad
