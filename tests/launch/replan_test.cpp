// `pentad launch --replan`'s rewrite of the job command (launch/replan.h), planned for the
// dgx-h100 preset so that the choice does not depend on this machine's calibration.
#include "launch/replan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launch/job_command.h"

using pentad::launch::Replan;
using pentad::launch::replan_after_loss;

namespace {

const std::string kRecipe = std::string(PENTAD_SOURCE_DIR) + "/recipes/gpt-tiny.toml";

std::vector<std::string> job(std::vector<std::string> extra = {}) {
  std::vector<std::string> c = {"mpirun",       "--oversubscribe",
                                "-np",          "8",
                                "build/pentad", "train",
                                kRecipe,        "parallel.tp=2",
                                "--set",        "parallel.pp=2",
                                "--set",        "parallel.dp=2",
                                "--set",        "train.micro_batch=2",
                                "--set",        "train.grad_accum=2"};
  c.insert(c.end(), extra.begin(), extra.end());
  return c;
}

const nlohmann::json kLayout = {{"dp", 2}, {"tp", 2},  {"cp", 1},          {"pp", 2},
                                {"ep", 1}, {"etp", 1}, {"micro_batch", 2}, {"grad_accum", 2}};

// The value the command sets for `key` last (what pentad train ends up with).
std::string value_of(const std::vector<std::string>& c, const std::string& key) {
  std::string v;
  for (const std::string& a : c)
    if (a.rfind(key + "=", 0) == 0) v = a.substr(key.size() + 1);
  return v;
}

}  // namespace

TEST(Replan, RewritesTheRankCountAndEveryLayoutKeyKeepingTheGlobalBatch) {
  std::string why;
  const Replan r =
      replan_after_loss(job({"--resume", "latest"}), kLayout, 8, 1, {"dgx-h100", ""}, &why);
  ASSERT_FALSE(r.command.empty()) << why;
  EXPECT_EQ(r.ranks_before, 8);
  EXPECT_GE(r.ranks_after, 1);
  EXPECT_LE(r.ranks_after, 7);
  EXPECT_EQ(r.command[3], std::to_string(r.ranks_after));
  EXPECT_EQ(r.global_batch, 8);
  EXPECT_EQ(value_of(r.command, "train.global_batch"), "8");
  const int tp = std::stoi(value_of(r.command, "parallel.tp"));
  const int pp = std::stoi(value_of(r.command, "parallel.pp"));
  const int dp = std::stoi(value_of(r.command, "parallel.dp"));
  const int mb = std::stoi(value_of(r.command, "train.micro_batch"));
  const int ga = std::stoi(value_of(r.command, "train.grad_accum"));
  EXPECT_EQ(tp * pp * dp, r.ranks_after);  // (cp 1: gpt-tiny's planner keeps it)
  EXPECT_EQ(mb * ga * dp, 8);
  // The old overrides of the keys it sets are gone, bare or --set, and the rest stays.
  EXPECT_EQ(std::count(r.command.begin(), r.command.end(), "parallel.tp=2"), tp == 2 ? 1 : 0);
  EXPECT_EQ(std::count(r.command.begin(), r.command.end(), "--resume"), 1);
  EXPECT_EQ(value_of(r.command, "parallel.topology"), "\"\"");
  EXPECT_GT(r.predicted_before_s, 0);
  EXPECT_GT(r.predicted_after_s, 0);
  EXPECT_LE(r.predicted_after_s, r.predicted_before_s * 8);
  EXPECT_NE(r.note.find("global batch 8 sequences kept"), std::string::npos) << r.note;
}

TEST(Replan, RefusesSayingWhy) {
  std::string why;
  EXPECT_TRUE(replan_after_loss(job(), kLayout, 8, 8, {"dgx-h100", ""}, &why).command.empty());
  EXPECT_NE(why.find("took all 8 ranks"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(replan_after_loss({"pentad", "train", kRecipe}, kLayout, 8, 1, {"dgx-h100", ""}, &why)
                  .command.empty());
  EXPECT_NE(why.find("no launcher rank count"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(replan_after_loss(job(), nlohmann::json::object(), 8, 1, {"dgx-h100", ""}, &why)
                  .command.empty());
  EXPECT_NE(why.find("did not report their layout"), std::string::npos) << why;
  // Memory for no layout of any count: the planner's refusal, naming what it would need.
  why.clear();
  EXPECT_TRUE(
      replan_after_loss(job({"--set", "train.memory_limit_mb=1", "--set", "model.d_model=512"}),
                        kLayout, 8, 1, {"dgx-h100", ""}, &why)
          .command.empty());
  EXPECT_NE(why.find("no layout of 1 to 7 ranks"), std::string::npos) << why;
  EXPECT_NE(why.find("memory"), std::string::npos) << why;
}

// Around a slow link: the same 4 ranks of dp 4 (a ring through the link 1-2) re-planned with
// that link 100 times slower; the new layout puts ranks 1 and 2 in no group together.
TEST(Replan, AroundASlowLinkKeepsTheRanksAndLeavesTheLinkOutOfEveryGroup) {
  std::vector<std::string> c = job();
  c[3] = "4";
  c.erase(std::find(c.begin(), c.end(), "parallel.tp=2"));
  c.insert(c.end(), {"--set", "parallel.tp=1", "--set", "parallel.pp=1", "--set", "parallel.dp=4",
                     "--set", "train.steps=200"});
  const nlohmann::json layout = {{"dp", 4}, {"tp", 1},  {"cp", 1},          {"pp", 1},
                                 {"ep", 1}, {"etp", 1}, {"micro_batch", 2}, {"grad_accum", 2}};
  std::string why;
  const Replan r =
      pentad::launch::replan_around(c, layout, 4, {{1, 2, 100.0}}, {"dgx-h100", ""}, &why);
  ASSERT_FALSE(r.command.empty()) << why;
  EXPECT_EQ(r.ranks_before, 4);
  EXPECT_EQ(r.ranks_after, 4);
  EXPECT_EQ(r.command[3], "4");
  EXPECT_EQ(r.steps, 200);
  EXPECT_EQ(r.layout_before.rfind("tp1 dp4", 0), 0u) << r.layout_before;
  EXPECT_NE(r.layout_after, r.layout_before);
  EXPECT_LT(r.predicted_after_s, r.predicted_before_s);
  EXPECT_NE(r.note.find("link 1-2 100x slower"), std::string::npos) << r.note;
  // The new degrees (tp, cp, dp, pp order): ranks 1 and 2 differ in two coordinates at least.
  const int tp = std::stoi(value_of(r.command, "parallel.tp"));
  const int cp = std::stoi(value_of(r.command, "parallel.cp"));
  const int dp = std::stoi(value_of(r.command, "parallel.dp"));
  auto coords = [&](int rank) {
    return std::vector<int>{rank % tp, rank / tp % cp, rank / (tp * cp) % dp,
                            rank / (tp * cp * dp)};
  };
  int differ = 0;
  for (size_t i = 0; i < 4; ++i) differ += coords(1)[i] != coords(2)[i];
  EXPECT_GE(differ, 2) << r.layout_after;
}

// After a host fault the restart's launcher leaves the host out: mpirun's hostfile (a copy
// without its lines) and --host list, srun's --exclude.
TEST(Replan, ALostHostLeavesTheLaunchersHostList) {
  const std::string hostfile = ::testing::TempDir() + "replan_hostfile";
  { std::ofstream(hostfile) << "h0 slots=4\n  h1 slots=4\nh10 slots=4\n"; }
  std::string note;
  const std::vector<std::string> mpirun =
      pentad::launch::without_host({"mpirun", "--hostfile", hostfile, "-H", "h1:4,h0:4", "-np", "8",
                                    "pentad", "train", "r.toml"},
                                   "h1", &note);
  EXPECT_EQ(mpirun[2], hostfile + ".without-h1");
  std::ifstream copy(mpirun[2]);
  const std::string kept((std::istreambuf_iterator<char>(copy)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "h0 slots=4\nh10 slots=4\n");
  EXPECT_EQ(mpirun[4], "h0:4");
  EXPECT_NE(note.find("without h1"), std::string::npos) << note;
  const std::vector<std::string> srun = pentad::launch::without_host(
      {"srun", "--exclude=n3", "-n", "8", "pentad", "train", "r.toml"}, "n7", &note);
  EXPECT_EQ(srun[1], "--exclude=n3,n7");
  // A list that does not name the host (an address): left as it is, and said.
  const std::vector<std::string> other = {
      "mpirun", "-H", "10.0.0.1,10.0.0.2", "-np", "2", "pentad", "train", "r.toml"};
  EXPECT_EQ(pentad::launch::without_host(other, "h1", &note), other);
  EXPECT_TRUE(note.empty());
}
