// The op profile (kernels/op_profile.h): what a timed step counts, and what it leaves out.
#include "kernels/op_profile.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "kernel_test_util.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;
namespace prof = kernels::op_profile;

const prof::OpTime* find(const prof::Profile& p, const std::string& op) {
  for (const prof::OpTime& row : p.ops)
    if (row.op == op) return &row;
  return nullptr;
}

TEST(OpProfile, CountsTheStepsOpsOnceWithTheirFlops) {
  prof::reset();
  const int64_t N = 24, C = 32, OC = 40;
  const auto inp = to_float(randn(size_t(N * C), 1)), w = to_float(randn(size_t(OC * C), 2)),
             dout = to_float(randn(size_t(N * OC), 3));
  std::vector<float> out(size_t(N * OC)), dinp(size_t(N * C)), dw(size_t(OC * C));
  auto forward = [&] {
    k::linear_forward(view(out, {N, OC}), view(inp, {N, C}), view(w, {OC, C}), Tensor{});
  };
  forward();  // before any step: not counted
  for (int step = 0; step < 2; ++step) {
    prof::begin_step(false);
    forward();
    forward();
    // Only dinp: one product; both: two.
    k::linear_backward(view(dinp, {N, C}), Tensor{}, Tensor{}, view(dout, {N, OC}), Tensor{},
                       view(w, {OC, C}), false);
    k::linear_backward(view(dinp, {N, C}), view(dw, {OC, C}), Tensor{}, view(dout, {N, OC}),
                       view(inp, {N, C}), view(w, {OC, C}), false);
    {  // a call inside a timed call counts once, in the outer one
      const prof::Scope outer("outer_op", false, 0);
      forward();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Another thread's calls are not this step's.
    std::thread other(forward);
    other.join();
    prof::end_step();
  }
  forward();  // after: not counted

  const prof::Profile p = prof::collect();
  EXPECT_EQ(p.steps, 2);
  const prof::OpTime* fwd = find(p, "linear_forward");
  const prof::OpTime* bwd = find(p, "linear_backward");
  const prof::OpTime* outer = find(p, "outer_op");
  ASSERT_TRUE(fwd && bwd && outer);
  EXPECT_EQ(fwd->calls, 4);
  EXPECT_EQ(bwd->calls, 4);
  EXPECT_EQ(outer->calls, 2);
  EXPECT_EQ(p.ops.size(), 3u);
  const double gemm = 2.0 * N * C * OC;
  EXPECT_DOUBLE_EQ(fwd->flops, 4 * gemm);
  EXPECT_DOUBLE_EQ(bwd->flops, 2 * (1 + 2) * gemm);
  EXPECT_EQ(outer->flops, 0);
  EXPECT_GE(outer->seconds, 2 * 0.002);
  // Most time first; the ops lie inside their steps.
  EXPECT_EQ(p.ops.front().op, "outer_op");
  for (const prof::OpTime& row : p.ops) EXPECT_GT(row.seconds, 0) << row.op;
  EXPECT_LE(p.op_seconds(), p.step_seconds);

  const std::string table = prof::report(p, 1e12);
  for (const char* text : {"op profile over 2 step(s)", "linear_forward", "linear_backward",
                           "outer_op", "outside the ops", "of peak"})
    EXPECT_NE(table.find(text), std::string::npos) << text << " in\n" << table;
  const auto json = nlohmann::json::parse(prof::to_json(p, 1e12));
  EXPECT_EQ(json["steps"], 2);
  EXPECT_EQ(json["ops"].size(), 3u);
  EXPECT_DOUBLE_EQ(json["ops"][1]["flops"].get<double>() + json["ops"][2]["flops"].get<double>(),
                   10 * gemm);
  EXPECT_NEAR(json["outside_seconds"].get<double>(), p.step_seconds - p.op_seconds(), 1e-12);

  prof::reset();
  EXPECT_EQ(prof::collect().steps, 0);
  EXPECT_TRUE(prof::collect().ops.empty());
}

// Misuse is an internal error (the trainer pairs the calls).
TEST(OpProfile, RefusesUnmatchedSteps) {
  prof::reset();
  EXPECT_THROW(prof::end_step(), std::logic_error);
  prof::begin_step(false);
  EXPECT_THROW(prof::begin_step(false), std::logic_error);
  EXPECT_THROW(prof::reset(), std::logic_error);
  prof::end_step();
  prof::reset();
}

}  // namespace
}  // namespace pentad
