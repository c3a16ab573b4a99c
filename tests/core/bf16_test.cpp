// Host bfloat16 conversion (core/bf16.h): round to nearest even, exact round trips.
#include "core/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace pentad {
namespace {

uint16_t bits_of(float f) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: up, to the even one.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  // Just above a tie rounds up.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  // Just below rounds down.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f807fffu)), 0x3f80);
}

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 1e-38f}) {
    const float exact = bf16_to_float(bits_of(f));  // truncated: representable
    EXPECT_EQ(bf16_to_float(float_to_bf16(exact)), exact) << f;
  }
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  // The largest float rounds up to infinity, as round-to-nearest requires.
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())), inf);
}

TEST(Bf16, RelativeErrorIsAtMostHalfAnUlp) {
  for (float f = 1e-3f; f < 1e3f; f *= 1.0137f) {
    const float r = bf16_to_float(float_to_bf16(f));
    EXPECT_LE(std::abs(r - f), std::ldexp(std::abs(f), -8)) << f;
  }
}

}  // namespace
}  // namespace pentad
