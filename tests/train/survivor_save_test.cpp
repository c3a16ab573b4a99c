// SurvivorSave (train/survivor_save.h): SIGTERM runs the write on the save's own thread, then
// SIGTERM's earlier handling; without a SIGTERM the write never runs, and the earlier handling
// is back after it.
#include "train/survivor_save.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

namespace pentad {
namespace {

std::atomic<int> g_earlier{0};
void earlier_handler(int) {
  g_earlier.fetch_add(1);
}

TEST(SurvivorSave, SigtermRunsTheWriteOnItsThreadThenTheEarlierHandler) {
  std::signal(SIGTERM, earlier_handler);
  g_earlier = 0;
  std::atomic<int> writes{0};
  std::atomic<bool> other_thread{false};
  const std::thread::id test_thread = std::this_thread::get_id();
  {
    SurvivorSave save([&] {
      other_thread = std::this_thread::get_id() != test_thread;
      writes.fetch_add(1);
    });
    std::raise(SIGTERM);
    for (int i = 0; i < 500 && g_earlier.load() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(writes.load(), 1);
    EXPECT_TRUE(other_thread.load());
    EXPECT_EQ(g_earlier.load(), 1);  // after the write: the earlier handling of SIGTERM
  }
  std::signal(SIGTERM, SIG_DFL);
}

TEST(SurvivorSave, WithoutASigtermNothingIsWrittenAndTheEarlierHandlerIsBack) {
  std::signal(SIGTERM, earlier_handler);
  g_earlier = 0;
  std::atomic<int> writes{0};
  {
    SurvivorSave save([&] { writes.fetch_add(1); });
  }
  EXPECT_EQ(writes.load(), 0);
  std::raise(SIGTERM);
  EXPECT_EQ(g_earlier.load(), 1);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace
}  // namespace pentad
