// check_store (launch/store_check.h): the checkpoint the ranks last reported, or a newer one
// retention kept instead, must still be there before a restart.
#include "launch/store_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace pentad::launch {
namespace {

namespace fs = std::filesystem;

TEST(StoreCheck, ALaggingReportIsServedByANewerCheckpoint) {
  const fs::path root =
      fs::path(::testing::TempDir()) / ("store_check_" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const char* step : {"step-00000010", "step-00000015"}) {
    fs::create_directories(root / step);
    std::ofstream(root / step / "manifest.json") << "{}";
  }
  // The oldest rank reported step 5, which retention has retired since: 10 and 15 serve.
  EXPECT_EQ(check_store(root.string(), {5, false, false}).blocked, "");
  EXPECT_EQ(check_store(root.string(), {15, false, false}).blocked, "");
  // A step newer than any kept, or a directory emptied (an unmounted share): blocked.
  const StoreCheck gone = check_store(root.string(), {20, false, false});
  EXPECT_EQ(gone.blocked, "checkpoint_dir");
  EXPECT_NE(gone.words.find("no longer holds step-00000020"), std::string::npos) << gone.words;
  fs::remove_all(root / "step-00000010");
  fs::remove_all(root / "step-00000015");
  EXPECT_EQ(check_store(root.string(), {5, true, false}).blocked, "checkpoint_dir");
  fs::remove_all(root);
}

}  // namespace
}  // namespace pentad::launch
