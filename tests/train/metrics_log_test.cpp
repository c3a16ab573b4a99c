// last_logged_step (train/metrics_log.h): the last step metrics.jsonl holds a loss for, which
// caps the survivors' state a resume may adopt.
#include "train/metrics_log.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace pentad {
namespace {

TEST(MetricsLog, LastLoggedStepIsTheNewestLossRow) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "pentad-metrics-log-test";
  std::filesystem::remove_all(dir);
  EXPECT_EQ(last_logged_step(dir.string()), -1);  // no log
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl")
      << "{\"step\":1,\"loss\":6.2}\n{\"step\":2,\"loss\":6.1}\n{\"step\":2,\"eval_loss\":6.0}\n"
         "{\"saved_step\":2,\"saver_write_seconds\":0.1}\n"
         "{\"step\":1,\"loss\":6.2}\n"       // a resumed run's rows come after the first's
         "{\"step\":9,\"eval_loss\":5.0}\n"  // not a loss row
         "{\"step\":3,\"lo";                 // cut short: the writer was killed
  EXPECT_EQ(last_logged_step(dir.string()), 2);
  std::ofstream(dir / "metrics.jsonl", std::ios::trunc);
  EXPECT_EQ(last_logged_step(dir.string()), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pentad
