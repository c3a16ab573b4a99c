// The progress line (core/progress.h): the rate in MB/s for bytes or in the caller's unit,
// the fraction of the total, and no fraction when the total is unknown. Off a terminal (as
// under ctest) each show() prints one plain line.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <string>

namespace pentad {
namespace {

std::string shown(Progress& progress, int64_t done, const char* counts) {
  ::testing::internal::CaptureStderr();
  progress.show(done, counts);
  return ::testing::internal::GetCapturedStderr();
}

TEST(Progress, BytesShowMegabytesPerSecondAndTheFraction) {
  Progress progress("data prepare", 1000);
  const std::string line = shown(progress, 250, "3 documents");
  EXPECT_EQ(line.rfind("data prepare: 3 documents | ", 0), 0u) << line;
  EXPECT_NE(line.find(" MB/s"), std::string::npos) << line;
  EXPECT_NE(line.find(" 25.0% | ETA "), std::string::npos) << line;
}

TEST(Progress, AUnitOfTheCallersShowsItsOwnRate) {
  Progress progress("tokenizer train: merging", 8000, "merges");
  const std::string line = shown(progress, 2000, "2000/8000 merges");
  EXPECT_NE(line.find(" merges/s"), std::string::npos) << line;
  EXPECT_EQ(line.find("MB/s"), std::string::npos) << line;
  EXPECT_NE(line.find(" 25.0% | ETA "), std::string::npos) << line;
}

TEST(Progress, AnUnknownTotalShowsOnlyTheRate) {
  Progress progress("ckpt convert", 0);
  const std::string line = shown(progress, 5 << 20, "1 tensor");
  EXPECT_NE(line.find(" MB/s"), std::string::npos) << line;
  EXPECT_EQ(line.find('%'), std::string::npos) << line;
}

}  // namespace
}  // namespace pentad
