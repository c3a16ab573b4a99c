// --exclude-culprit's rewrite of the job command (launch/exclude.h): one data-parallel replica
// fewer, the global batch kept where it divides, and each refusal saying what stands in the way.
#include "launch/exclude.h"

#include <gtest/gtest.h>

#include <algorithm>

using nlohmann::json;
using pentad::launch::exclude_one_replica;
using pentad::launch::Exclusion;

namespace {

const std::vector<std::string> kJob = {
    "mpirun", "--oversubscribe", "-np",           "8",     "/bin/pentad",   "train",
    "r.toml", "--set",           "parallel.tp=2", "--set", "parallel.dp=9", "--resume",
    "latest"};

json layout(int dp, int tp, int64_t accum) {
  return {{"dp", dp}, {"tp", tp}, {"cp", 1},          {"pp", 1},
          {"ep", 1},  {"etp", 1}, {"micro_batch", 2}, {"grad_accum", accum}};
}

TEST(Exclude, OneReplicaFewerKeepingTheGlobalBatchWhereItDivides) {
  std::string why;
  const Exclusion x = exclude_one_replica(kJob, layout(4, 2, 3), 8, &why);  // 3 x 4 / 3 = 4
  ASSERT_FALSE(x.command.empty()) << why;
  const std::vector<std::string> want = {"mpirun",
                                         "--oversubscribe",
                                         "-np",
                                         "6",
                                         "/bin/pentad",
                                         "train",
                                         "r.toml",
                                         "--set",
                                         "parallel.tp=2",
                                         "--resume",
                                         "latest",
                                         "--set",
                                         "parallel.dp=3",
                                         "--set",
                                         "train.grad_accum=4"};
  EXPECT_EQ(x.command, want);
  EXPECT_EQ(x.global_batch_before, 24);
  EXPECT_EQ(x.global_batch_after, 24);
  EXPECT_EQ(x.ranks_after, 6);
}

TEST(Exclude, ABatchThatDoesNotDivideShrinksAndSaysSo) {
  std::string why;
  const Exclusion x = exclude_one_replica(kJob, layout(4, 2, 1), 8, &why);  // 1 x 4 / 3
  ASSERT_FALSE(x.command.empty()) << why;
  EXPECT_EQ(x.global_batch_after, 6);  // 2 x 1 x 3
  EXPECT_NE(x.note.find("fewer sequences"), std::string::npos) << x.note;
  EXPECT_EQ(std::count(x.command.begin(), x.command.end(), "train.grad_accum=1"), 0);
}

// srun counts ranks with -n N or --ntasks=N; its -c is CPUs per task, which stays.
TEST(Exclude, SrunsRankCountIsLoweredAndItsCpusPerTaskKept) {
  std::string why;
  const std::vector<std::string> joined = {"/usr/bin/srun", "--ntasks=8",  "-c",    "2",
                                           "--mpi=pmix",    "/bin/pentad", "train", "r.toml"};
  Exclusion x = exclude_one_replica(joined, layout(4, 2, 1), 8, &why);
  ASSERT_FALSE(x.command.empty()) << why;
  EXPECT_EQ(x.command[1], "--ntasks=6");
  EXPECT_EQ(x.command[3], "2");
  const std::vector<std::string> split = {"srun", "-n", "8", "-c", "2", "/bin/pentad", "train"};
  x = exclude_one_replica(split, layout(4, 2, 1), 8, &why);
  ASSERT_FALSE(x.command.empty()) << why;
  EXPECT_EQ(x.command[2], "6");
  EXPECT_EQ(x.command[4], "2");
}

TEST(Exclude, RefusalsSayWhatStandsInTheWay) {
  std::string why;
  EXPECT_TRUE(exclude_one_replica(kJob, layout(1, 8, 1), 8, &why).command.empty());
  EXPECT_NE(why.find("parallel.dp is 1"), std::string::npos) << why;
  const std::vector<std::string> no_count = {"srun", "/bin/pentad", "train", "r.toml"};
  EXPECT_TRUE(exclude_one_replica(no_count, layout(4, 2, 1), 8, &why).command.empty());
  EXPECT_NE(why.find("-np N"), std::string::npos) << why;
  EXPECT_TRUE(exclude_one_replica(kJob, layout(4, 2, 1), 16, &why).command.empty());
  EXPECT_NE(why.find("reported 16"), std::string::npos) << why;
  EXPECT_TRUE(exclude_one_replica(kJob, json::object(), 8, &why).command.empty());
  EXPECT_NE(why.find("layout"), std::string::npos) << why;
  json moe = layout(4, 2, 1);
  moe["ep"] = 4;  // 3 x 2 ranks cannot hold 4 expert groups
  EXPECT_TRUE(exclude_one_replica(kJob, moe, 8, &why).command.empty());
  EXPECT_NE(why.find("ep 4"), std::string::npos) << why;
}

}  // namespace
