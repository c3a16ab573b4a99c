// The device mesh: validation messages, the rank arithmetic (by hand for small layouts),
// and the groups MPI builds, checked by all_gather of world ranks. Layouts run when
// their product equals the number of ranks started (4 and 8 in ctest).
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tests/parallel/mpi_test_util.h"

namespace pentad::parallel {
namespace {

using mpi_test::world_size;

MeshConfig layout(int tp, int cp, int dp, int pp, int ep = 1, int etp = 1,
                  std::string order = "tp,cp,dp,pp") {
  MeshConfig c;
  c.tp = tp, c.cp = cp, c.dp = dp, c.pp = pp, c.ep = ep, c.etp = etp;
  c.order = std::move(order);
  return c;
}

// The message of the pentad::Error that `f` throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- validation: each refusal names what to change ----

TEST(MeshValidate, ProductMustMatchTheRanksStarted) {
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 2, 1), 6); }),
            "tp 2 × cp 1 × dp 2 × pp 1 = 4 ranks but 6 were started: change dp to 3 or start 4 "
            "ranks");
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 1, 2), 6); }),
            "tp 2 × cp 1 × dp 1 × pp 2 = 4 ranks but 6 were started: start 4 ranks");
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 2, 1), 4); }), "");
}

TEST(MeshValidate, DegreesMustBePositive) {
  EXPECT_EQ(error_of([] { validate(layout(0, 1, 1, 1), 1); }),
            "mesh: tp is 0 but every degree must be at least 1: set tp to 1 or more");
  EXPECT_EQ(error_of([] { validate(layout(1, 1, 1, 1, 1, -2), 1); }),
            "mesh: etp is -2 but every degree must be at least 1: set etp to 1 or more");
}

TEST(MeshValidate, OrderMustBeAPermutationOfTheDenseAxes) {
  EXPECT_EQ(error_of([] { validate(layout(1, 1, 1, 1, 1, 1, "tp,cp,xp,pp"), 1); }),
            "mesh order \"tp,cp,xp,pp\": unknown axis 'xp': list tp, cp, dp and pp once each, "
            "innermost first (e.g. \"tp,cp,dp,pp\"); ep and etp are placed by the expert view");
  EXPECT_EQ(error_of([] { validate(layout(1, 1, 1, 1, 1, 1, "tp,cp,dp,pp,tp"), 1); }),
            "mesh order \"tp,cp,dp,pp,tp\" names tp twice: list tp, cp, dp and pp once each");
  EXPECT_EQ(error_of([] { validate(layout(1, 1, 1, 1, 1, 1, "tp,cp,dp"), 1); }),
            "mesh order \"tp,cp,dp\" leaves out pp: list tp, cp, dp and pp once each");
  EXPECT_NE(error_of([] { validate(layout(1, 1, 1, 1, 1, 1, "tp,ep,dp,pp"), 1); }).find("'ep'"),
            std::string::npos);
  EXPECT_EQ(error_of([] { validate(layout(1, 1, 1, 1, 1, 1, "pp, dp, cp, tp"), 1); }), "");
}

TEST(MeshValidate, ExpertDegreesMustDivideAStage) {
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 2, 1, 8, 1), 4); }),
            "ep 8 × etp 1 = 8 does not divide the 4 ranks of a pipeline stage (dp 2 × cp 1 × tp "
            "2): change ep to a divisor of 4 (1, 2, 4)");
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 3, 1, 1, 4), 6); }),
            "ep 1 × etp 4 = 4 does not divide the 6 ranks of a pipeline stage (dp 3 × cp 1 × tp "
            "2): change etp to a divisor of 6 (1, 2, 3, 6)");
  // Folding lets ep exceed dp: 4 experts groups over tp 2 × dp 2.
  EXPECT_EQ(error_of([] { validate(layout(2, 1, 2, 1, 4, 1), 4); }), "");
}

TEST(MeshCheckLayout, RefusalsNameTheDegreeOrModelKey) {
  // d_model 96, n_head 8, kv 4, vocab 1000, ffn 256, 4 layers, seq 64, micro-batch 2
  auto check = [](MeshConfig c, bool sp = false, int64_t seq_len = 64) {
    return error_of([&] { check_layout(c, 96, 8, 4, 1000, 256, 4, seq_len, 2, sp); });
  };
  EXPECT_EQ(check(layout(4, 2, 1, 4)), "");
  EXPECT_EQ(check(layout(3, 1, 1, 1)),
            "tp 3 does not divide model.n_head = 8: change tp to a divisor of 8 (1, 2, 4, 8)");
  EXPECT_EQ(check(layout(8, 1, 1, 1)),
            "tp 8 does not divide model.n_kv_head = 4: change tp to a divisor of 4 (1, 2, 4)");
  EXPECT_EQ(
      error_of([] { check_layout(layout(2, 1, 1, 1), 96, 8, 4, 1001, 256, 4, 64, 2, false); }),
      "tp 2 does not divide model.vocab_size = 1001: pad model.vocab_size to a multiple of 2 "
      "(e.g. 1002) or change tp to a divisor of 1001 (1, 7, 11, 13, 77, 91, 143, 1001)");
  EXPECT_EQ(
      error_of([] { check_layout(layout(4, 1, 1, 1), 96, 8, 4, 1000, 250, 4, 64, 2, false); }),
      "tp 4 does not divide model.d_ff = 250: change tp to a divisor of 250 (1, 2, 5, 10, "
      "25, 50, 125, 250)");
  EXPECT_EQ(error_of([] { check_layout(layout(4, 1, 1, 1), 96, 8, 4, 1000, 256, 4, 5, 1, true); }),
            "with sequence parallelism tp 4 must divide train.micro_batch × train.seq_len = 1 × "
            "5 = 5: change tp to a divisor of 5 (1, 5) or change train.seq_len");
  EXPECT_EQ(check(layout(1, 3, 1, 1)),
            "cp 3 does not divide train.seq_len = 64: change cp to a divisor of 64 (1, 2, 4, 8, "
            "16, 32, 64) or train.seq_len to a multiple of 3");
  EXPECT_EQ(check(layout(1, 1, 1, 8)),
            "pp 8 is more than model.n_layer = 4: every pipeline stage needs a layer; change pp "
            "to at most 4");
  // 2D tp: heads split over d1 only, and d2 must divide tp.
  MeshConfig two = layout(8, 1, 1, 1);
  two.tp_d2 = 2;
  EXPECT_EQ(check(two), "");  // d1 4 divides the 4 kv heads where tp 8 does not
  two.tp_d2 = 1;
  two.tp = 16;
  two.tp_d2 = 2;
  EXPECT_EQ(check(two),
            "the 2D tp shape 8x2 splits model.n_kv_head = 4 over d1 = 8, which does not divide "
            "it: change parallel.tp_shape so that d1 is a divisor of 4 (1, 2, 4)");
  MeshConfig wide = layout(10, 1, 1, 1);
  wide.tp_d2 = 5;  // d1 2 divides the heads; d2 5 does not divide the width
  EXPECT_EQ(check(wide),
            "the 2D tp shape 2x5 splits model.d_model = 96 over d2 = 5, which does not divide "
            "it: change parallel.tp_shape so that d2 is a divisor of 96 (1, 2, 3, 4, 6, 8, 12, "
            "16, 24, 32, 48, 96)");
  MeshConfig odd = layout(4, 1, 1, 1);
  odd.tp_d2 = 3;
  EXPECT_EQ(error_of([&] { validate(odd, 4); }),
            "mesh: the 2D tp shape 1x3 does not multiply to tp 4: set parallel.tp_shape to "
            "\"d1xd2\" with d2 a divisor of 4 (1, 2, 4)");
  // n_kv_head 0 means n_head (MHA); without sequence parallelism seq_len may be odd for tp.
  EXPECT_EQ(error_of([] { check_layout(layout(8, 1, 1, 1), 96, 8, 0, 1000, 256, 4, 5, 1, false); }),
            "");
}

// ---- the rank arithmetic, by hand ----

TEST(MeshCoords, DefaultOrderKeepsTpInnermost) {
  // tp 2 × dp 2 × pp 2: world_rank = tp + 2*dp + 4*pp.
  const MeshConfig c = layout(2, 1, 2, 2, /*ep=*/2, /*etp=*/1);
  const MeshCoords x = mesh_coords(c, 5);  // 5 = 1 + 2*0 + 4*1
  EXPECT_EQ(x[size_t(Axis::TP)], 1);
  EXPECT_EQ(x[size_t(Axis::CP)], 0);
  EXPECT_EQ(x[size_t(Axis::DP)], 0);
  EXPECT_EQ(x[size_t(Axis::PP)], 1);
  // stage index = tp + 2*dp = 1 -> etp 0, ep 1, edp 0
  EXPECT_EQ(x[size_t(Axis::ETP)], 0);
  EXPECT_EQ(x[size_t(Axis::EP)], 1);
  EXPECT_EQ(x[size_t(Axis::EDP)], 0);
  EXPECT_EQ(mesh_degree(c, Axis::EDP), 2);
  EXPECT_EQ(mesh_rank(c, 1, 0, 0, 1), 5);
}

TEST(MeshCoords, CustomOrderAndFoldedExperts) {
  // order pp innermost, then tp, then dp: world_rank = pp + 2*tp + 4*dp.
  const MeshConfig c = layout(2, 1, 2, 2, /*ep=*/4, /*etp=*/1, "pp,tp,dp,cp");
  const MeshCoords x = mesh_coords(c, 6);  // 6 = 0 + 2*1 + 4*1
  EXPECT_EQ(x[size_t(Axis::PP)], 0);
  EXPECT_EQ(x[size_t(Axis::TP)], 1);
  EXPECT_EQ(x[size_t(Axis::DP)], 1);
  // Within the stage, pp left out: index = tp + 2*dp = 3 -> ep 3 (ep 4 > dp 2: folding)
  EXPECT_EQ(x[size_t(Axis::EP)], 3);
  EXPECT_EQ(x[size_t(Axis::ETP)], 0);
  EXPECT_EQ(x[size_t(Axis::EDP)], 0);
  EXPECT_EQ(mesh_rank(c, 1, 0, 1, 0), 6);
}

TEST(MeshCoords, EveryLayoutIsABijection) {
  for (const MeshConfig& c : {layout(2, 2, 2, 2, 4, 2), layout(4, 1, 2, 2, 2, 4, "dp,tp,pp,cp"),
                              layout(1, 2, 3, 2, 3, 2, "cp,pp,dp,tp"), layout(3, 1, 1, 1, 1, 3)}) {
    const int world = c.tp * c.cp * c.dp * c.pp;
    validate(c, world);
    std::set<std::vector<int>> dense, expert;
    for (int r = 0; r < world; ++r) {
      const MeshCoords x = mesh_coords(c, r);
      EXPECT_EQ(mesh_rank(c, x[0], x[1], x[2], x[3]), r) << c.order;
      dense.insert({x[0], x[1], x[2], x[3]});
      expert.insert(
          {x[size_t(Axis::PP)], x[size_t(Axis::EDP)], x[size_t(Axis::EP)], x[size_t(Axis::ETP)]});
      for (int a = 0; a < kNumAxes; ++a) {
        EXPECT_GE(x[size_t(a)], 0);
        EXPECT_LT(x[size_t(a)], mesh_degree(c, Axis(a)));
      }
    }
    EXPECT_EQ(dense.size(), size_t(world));
    EXPECT_EQ(expert.size(), size_t(world));
  }
}

// ---- the groups MPI builds ----

// World ranks of `comm`'s members in group-rank order.
std::vector<int> members(Communicator& comm, int world_rank) {
  std::vector<int32_t> mine{world_rank}, all(static_cast<size_t>(comm.size()));
  comm.all_gather(Tensor{all.data(), DType::I32, Device::CPU, Shape{int64_t(all.size())}},
                  Tensor{mine.data(), DType::I32, Device::CPU, Shape{1}});
  return {all.begin(), all.end()};
}

// The world ranks whose coordinates equal `me` on every axis in `shared`, ascending.
std::vector<int> expected_members(const MeshConfig& c, int world, int me,
                                  std::vector<Axis> shared) {
  const MeshCoords mine = mesh_coords(c, me);
  std::vector<int> out;
  for (int r = 0; r < world; ++r) {
    const MeshCoords x = mesh_coords(c, r);
    if (std::all_of(shared.begin(), shared.end(),
                    [&](Axis a) { return x[size_t(a)] == mine[size_t(a)]; }))
      out.push_back(r);
  }
  return out;
}

// Every group of `c` holds exactly the ranks that share the other coordinates, in
// coordinate order, and reduces across them.
void check_groups(const MeshConfig& c) {
  Mesh mesh = Mesh::create(c, MPI_COMM_WORLD);
  const int me = mesh.world_rank(), world = mesh.world_size();
  const std::vector<std::pair<Axis, std::vector<Axis>>> groups = {
      {Axis::TP, {Axis::CP, Axis::DP, Axis::PP}},   {Axis::CP, {Axis::TP, Axis::DP, Axis::PP}},
      {Axis::DP, {Axis::TP, Axis::CP, Axis::PP}},   {Axis::PP, {Axis::TP, Axis::CP, Axis::DP}},
      {Axis::EP, {Axis::PP, Axis::EDP, Axis::ETP}}, {Axis::ETP, {Axis::PP, Axis::EDP, Axis::EP}},
      {Axis::EDP, {Axis::PP, Axis::EP, Axis::ETP}},
  };
  for (const auto& [axis, shared] : groups) {
    Communicator& g = mesh.group(axis);
    EXPECT_EQ(g.name(), axis_name(axis));
    EXPECT_EQ(g.size(), mesh.degree(axis)) << axis_name(axis);
    EXPECT_EQ(g.rank(), mesh.coord(axis)) << axis_name(axis);
    EXPECT_EQ(members(g, me), expected_members(c, world, me, shared)) << axis_name(axis);
    // Group rank q is the member with coordinate q.
    const std::vector<int> m = members(g, me);
    for (size_t q = 0; q < m.size(); ++q)
      EXPECT_EQ(mesh_coords(c, m[q])[size_t(axis)], int(q)) << axis_name(axis);
  }
  EXPECT_EQ(members(mesh.dp_cp(), me), expected_members(c, world, me, {Axis::TP, Axis::PP}));
  EXPECT_EQ(mesh.dp_cp().size(), c.dp * c.cp);
  EXPECT_EQ(members(mesh.world(), me), expected_members(c, world, me, {}));
  // A reduction in the tp group sums exactly its members' world ranks.
  std::vector<int32_t> x{me};
  mesh.group(Axis::TP).all_reduce(Tensor{x.data(), DType::I32, Device::CPU, Shape{1}});
  const std::vector<int> tp = expected_members(c, world, me, {Axis::CP, Axis::DP, Axis::PP});
  int sum = 0;
  for (int r : tp) sum += r;
  EXPECT_EQ(x[0], sum);
}

TEST(MeshGroups, FourRanksByHand) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  // tp 2 × dp 2, default order: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}; ep 4 folds
  // the whole stage into one expert group; etp 1.
  Mesh mesh = Mesh::create(layout(2, 1, 2, 1, 4, 1), MPI_COMM_WORLD);
  const int me = mesh.world_rank();
  const std::vector<std::vector<int>> tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members(mesh.group(Axis::TP), me), tp[size_t(me)]);
  EXPECT_EQ(members(mesh.group(Axis::DP), me), dp[size_t(me)]);
  EXPECT_EQ(members(mesh.group(Axis::EP), me), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(members(mesh.group(Axis::EDP), me), (std::vector<int>{me}));
  EXPECT_EQ(members(mesh.dp_cp(), me), dp[size_t(me)]);
  EXPECT_EQ(mesh.coord(Axis::EP), me);
  if (me == 3) {
    EXPECT_EQ(mesh.describe(), "rank 3: pp 0/1 dp 1/2 cp 0/1 tp 1/2 | ep 3/4 etp 0/1 edp 0/1");
  }

  // ep 2 × etp 2 over the same ranks: stage index = world rank, etp innermost, so the etp
  // groups are {0,1} {2,3} and the ep groups {0,2} {1,3}.
  Mesh folded = Mesh::create(layout(2, 1, 2, 1, 2, 2), MPI_COMM_WORLD);
  EXPECT_EQ(members(folded.group(Axis::ETP), me), tp[size_t(me)]);
  EXPECT_EQ(members(folded.group(Axis::EP), me), dp[size_t(me)]);
  EXPECT_EQ(folded.coord(Axis::ETP), me % 2);
  EXPECT_EQ(folded.coord(Axis::EP), me / 2);
}

TEST(MeshGroups, TwoDimensionalTpByHand) {
  if (world_size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  // tp 4 as 2x2 (times dp). Row-first: tp rank t is (i, j) = (t / 2, t % 2): the hidden
  // groups (same i) are adjacent ranks {0,1} {2,3}, the heads groups (same j) {0,2} {1,3}.
  MeshConfig c = layout(4, 1, world_size() / 4, 1);
  c.tp_d2 = 2;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int b = me / 4 * 4, t = me % 4;  // this tp group's first rank, the tp rank
  Mesh row = Mesh::create(c, MPI_COMM_WORLD);
  EXPECT_EQ(members(*row.tp_hidden(), me), (std::vector<int>{b + t / 2 * 2, b + t / 2 * 2 + 1}));
  EXPECT_EQ(members(*row.tp_heads(), me), (std::vector<int>{b + t % 2, b + t % 2 + 2}));
  EXPECT_EQ(members(*row.tp_all(), me), (std::vector<int>{b, b + 1, b + 2, b + 3}));
  // Column-first: t is (t % 2, t / 2): the heads groups are the adjacent ones, and the
  // logical order (i * d2 + j) is 0, 2, 1, 3.
  c.tp_column_first = true;
  Mesh column = Mesh::create(c, MPI_COMM_WORLD);
  EXPECT_EQ(members(*column.tp_heads(), me), (std::vector<int>{b + t / 2 * 2, b + t / 2 * 2 + 1}));
  EXPECT_EQ(members(*column.tp_hidden(), me), (std::vector<int>{b + t % 2, b + t % 2 + 2}));
  EXPECT_EQ(members(*column.tp_all(), me), (std::vector<int>{b, b + 2, b + 1, b + 3}));
  EXPECT_EQ(tp_place(c, 1).i, 1);
  EXPECT_EQ(tp_place(c, 1).j, 0);
  // 1D: none of them.
  Mesh flat = Mesh::create(layout(4, 1, world_size() / 4, 1), MPI_COMM_WORLD);
  EXPECT_EQ(flat.tp_all(), nullptr);
}

TEST(MeshGroups, EightRanksEveryAxisByHand) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  // tp 2 × dp 2 × pp 2 (world_rank = tp + 2*dp + 4*pp) with ep 2 × etp 2 folded over each
  // stage's 4 ranks: stage index = tp + 2*dp, etp = tp, ep = dp, edp 1.
  // Then tp 2 × cp 2 × pp 2, order "cp,tp,pp,dp" (cp innermost, dp 1), ep 2 × etp 1:
  // world_rank = cp + 2*tp + 4*pp, stage index = cp + 2*tp, ep = cp, edp = tp.
  {
    Mesh mesh = Mesh::create(layout(2, 1, 2, 2, 2, 2), MPI_COMM_WORLD);
    const int me = mesh.world_rank(), stage = me / 4 * 4;
    EXPECT_EQ(members(mesh.group(Axis::TP), me), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.group(Axis::PP), me), (std::vector<int>{me % 4, me % 4 + 4}));
    EXPECT_EQ(members(mesh.group(Axis::ETP), me), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.group(Axis::EP), me),
              (std::vector<int>{stage + me % 2, stage + me % 2 + 2}));
    EXPECT_EQ(mesh.degree(Axis::EDP), 1);
    if (me == 5) {
      EXPECT_EQ(mesh.describe(), "rank 5: pp 1/2 dp 0/2 cp 0/1 tp 1/2 | ep 0/2 etp 1/2 edp 0/1");
    }
  }
  {
    Mesh mesh = Mesh::create(layout(2, 2, 1, 2, 2, 1, "cp,tp,pp,dp"), MPI_COMM_WORLD);
    const int me = mesh.world_rank(), stage = me / 4 * 4;
    EXPECT_EQ(members(mesh.group(Axis::CP), me), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.group(Axis::TP), me),
              (std::vector<int>{stage + me % 2, stage + me % 2 + 2}));
    EXPECT_EQ(members(mesh.group(Axis::EP), me), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.group(Axis::EDP), me),
              (std::vector<int>{stage + me % 2, stage + me % 2 + 2}));
    EXPECT_EQ(members(mesh.dp_cp(), me), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    if (me == 6) {
      EXPECT_EQ(mesh.describe(), "rank 6: dp 0/1 pp 1/2 tp 1/2 cp 0/2 | ep 0/2 etp 0/1 edp 1/2");
    }
  }
}

TEST(MeshGroups, EveryGroupHoldsTheRanksSharingTheOtherCoordinates) {
  const int n = world_size();
  std::vector<MeshConfig> layouts;
  if (n == 4)
    layouts = {layout(2, 1, 2, 1),
               layout(2, 2, 1, 1, 2, 2),
               layout(1, 2, 1, 2, 2, 1, "pp,cp,tp,dp"),
               layout(1, 1, 4, 1, 4, 1),
               layout(2, 1, 1, 2, 1, 2, "dp,pp,tp,cp"),
               layout(2, 1, 2, 1, 4, 1, "dp,tp,cp,pp")};
  else if (n == 8)
    layouts = {layout(2, 1, 2, 2, 2, 2), layout(2, 2, 2, 1, 4, 1),
               layout(2, 2, 1, 2, 2, 2, "cp,tp,pp,dp"), layout(1, 2, 2, 2, 2, 1, "pp,dp,cp,tp"),
               layout(4, 1, 2, 1, 8, 1)};
  else
    GTEST_SKIP() << "layouts are listed for 4 and 8 ranks";
  for (const MeshConfig& c : layouts) {
    SCOPED_TRACE(fmt::format("tp {} cp {} dp {} pp {} ep {} etp {} order {}", c.tp, c.cp, c.dp,
                             c.pp, c.ep, c.etp, c.order));
    check_groups(c);
  }
}

TEST(MeshGroups, CreateRefusesABadLayoutOnEveryRank) {
  const int n = world_size();
  const MeshConfig c = layout(n + 1, 1, 1, 1);
  const std::string message = error_of([&] { Mesh::create(c, MPI_COMM_WORLD); });
  EXPECT_NE(message.find(fmt::format("but {} were started", n)), std::string::npos) << message;
}

}  // namespace
}  // namespace pentad::parallel
