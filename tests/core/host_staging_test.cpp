// HostStaging's bookkeeping (core/device_memory.h), the part both device-memory backends
// share: which block a span or a release names. The first multi-rank run on a GPU
// (2026-11-29) found page-locked blocks placed end to end, where a release of the second
// block was taken for the first.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "core/device_memory.h"

using namespace pentad;

namespace {

TEST(HostStaging, TheEndOfABlockIsNotTheNextOne) {
  alignas(64) char memory[8192] = {};
  char* first = memory;
  char* second = memory + 4096;  // right after the first, as cudaMallocHost may place it
  EXPECT_FALSE(HostStaging::holds(first, 4096, second, 0));
  EXPECT_TRUE(HostStaging::holds(second, 4096, second, 0));
  EXPECT_TRUE(HostStaging::holds(first, 4096, first, 4096));
  EXPECT_TRUE(HostStaging::holds(first, 4096, second - 1, 1));
  EXPECT_FALSE(HostStaging::holds(first, 4096, second - 1, 2));
  EXPECT_FALSE(HostStaging::holds(first, 4096, first + 1, 4096));
  EXPECT_FALSE(HostStaging::holds(second, 4096, first, 1));
  EXPECT_FALSE(HostStaging::holds(second, 4096, second + 4096, 0));
}

TEST(HostStaging, ReleaseNamesTheBlockItStarts) {
  HostStaging staging;
  char* a = static_cast<char*>(staging.acquire(100, false));
  char* b = static_cast<char*>(staging.acquire(100, false));
  ASSERT_NE(a, b);
  staging.release(b);
  // A span in the block given back is refused, and says so; one in the other is taken.
  try {
    char out[8];
    staging.upload(out, Device::CPU, b, sizeof(out));
    FAIL() << "a span in a released block was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already given back"), std::string::npos) << e.what();
  }
  char in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {};
  staging.download(a + 8, in, Device::CPU, sizeof(in));
  staging.upload(out, Device::CPU, a + 8, sizeof(out));
  EXPECT_EQ(std::string(out, 8), std::string(in, 8));
  // Only a block's start releases it, and only once.
  EXPECT_THROW(staging.release(a + 8), Error);
  staging.release(a);
  try {
    staging.release(a);
    FAIL() << "a block was given back twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("given back twice"), std::string::npos) << e.what();
  }
  // Both are free again: two acquisitions take them, smallest first, and no third is made.
  const size_t held = staging.held_bytes();
  void* c = staging.acquire(100, false);
  void* d = staging.acquire(100, false);
  EXPECT_TRUE((c == a && d == b) || (c == b && d == a));
  EXPECT_EQ(staging.held_bytes(), held);
}

}  // namespace
