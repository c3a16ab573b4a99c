// cuda_kernels_test: linear layers (cuBLASLt), with and without the fused GELU, against
// the CPU (the program, its fixtures and bounds: cuda_kernels_test.h).
#include <string>
#include <vector>

#include "kernels/op_profile.h"
#include "tests/cuda/cuda_kernels_test.h"

namespace pentad::cuda_kernels {
namespace {

// ---- linear ----

struct LinearShape {
  int64_t N, C, OC;
};
const LinearShape kLinearShapes[] = {{1, 1, 1},      {7, 3, 5},      {33, 17, 9},    {64, 64, 64},
                                     {129, 96, 200}, {257, 768, 72}, {100, 256, 768}};

std::string str(LinearShape s) {
  return "N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " OC " + std::to_string(s.OC);
}

TEST_P(CudaKernel, LinearForward) {
  for (LinearShape s : kLinearShapes)
    for (bool with_bias : {true, false}) {
      const auto x = rand(s.N * s.C), w = rand(s.OC * s.C, 0.1), b = rand(s.OC);
      std::vector<float> want(s.N * s.OC);
      k::linear_forward(view(want, {s.N, s.OC}), view(x, {s.N, s.C}), view(w, {s.OC, s.C}),
                        with_bias ? view(b, {s.OC}) : Tensor{});
      const Tensor out = gpu.poisoned({s.N, s.OC}, dt());
      k::linear_forward(out, gpu.upload(x, {s.N, s.C}, dt()), gpu.upload(w, {s.OC, s.C}, dt()),
                        with_bias ? gpu.upload(b, {s.OC}, dt()) : Tensor{});
      expect_close("linear_forward " + str(s) + (with_bias ? " bias" : ""), out, want, dt());
    }
}

TEST_P(CudaKernel, LinearGeluForward) {
  // OC a multiple of 8 takes cuBLASLt's GELU epilogue; other widths the fallback.
  for (LinearShape s : kLinearShapes)
    for (bool with_bias : {true, false}) {
      const auto x = rand(s.N * s.C), w = rand(s.OC * s.C, 0.1), b = rand(s.OC);
      std::vector<float> want(s.N * s.OC), want_pre(s.N * s.OC);
      k::linear_gelu_forward(view(want, {s.N, s.OC}), view(want_pre, {s.N, s.OC}),
                             view(x, {s.N, s.C}), view(w, {s.OC, s.C}),
                             with_bias ? view(b, {s.OC}) : Tensor{});
      const Tensor out = gpu.poisoned({s.N, s.OC}, dt()), pre = gpu.poisoned({s.N, s.OC}, dt());
      k::linear_gelu_forward(out, pre, gpu.upload(x, {s.N, s.C}, dt()),
                             gpu.upload(w, {s.OC, s.C}, dt()),
                             with_bias ? gpu.upload(b, {s.OC}, dt()) : Tensor{});
      expect_close("linear_gelu_forward out " + str(s), out, want, dt());
      expect_close("linear_gelu_forward pre_gelu " + str(s), pre, want_pre, dt());
    }
}

TEST_P(CudaKernel, LinearBackward) {
  for (LinearShape s : kLinearShapes)
    for (bool accumulate : {false, true}) {
      const auto x = rand(s.N * s.C), w = rand(s.OC * s.C, 0.1), dy = rand(s.N * s.OC);
      const auto dx0 = rand(s.N * s.C);
      const auto dw0 = random(DType::F32, s.OC * s.C, 91), db0 = random(DType::F32, s.OC, 92);
      std::vector<float> dx = dx0, dw = dw0, db = db0;
      k::linear_backward(view(dx, {s.N, s.C}), view(dw, {s.OC, s.C}), view(db, {s.OC}),
                         view(dy, {s.N, s.OC}), view(x, {s.N, s.C}), view(w, {s.OC, s.C}),
                         accumulate);
      const Tensor gdx =
          accumulate ? gpu.upload(dx0, {s.N, s.C}, dt()) : gpu.poisoned({s.N, s.C}, dt());
      const Tensor gdw = gpu.upload(dw0, {s.OC, s.C}, DType::F32);
      const Tensor gdb = gpu.upload(db0, {s.OC}, DType::F32);
      k::linear_backward(gdx, gdw, gdb, gpu.upload(dy, {s.N, s.OC}, dt()),
                         gpu.upload(x, {s.N, s.C}, dt()), gpu.upload(w, {s.OC, s.C}, dt()),
                         accumulate);
      const std::string what = str(s) + (accumulate ? " accumulate" : "");
      expect_close("dinp " + what, gdx, dx, dt());
      expect_close("dweight " + what, gdw, dw, dt());
      expect_close("dbias " + what, gdb, db, dt());
    }
}

TEST_P(CudaKernel, LinearBackwardThroughGelu) {
  for (LinearShape s : kLinearShapes) {
    const auto pre = rand(s.N * s.C), w = rand(s.OC * s.C, 0.1), dy = rand(s.N * s.OC);
    std::vector<float> x(pre.size());
    k::gelu_forward(view(x, {s.N, s.C}), view(pre, {s.N, s.C}));
    x = rounded(dt(), x);  // the layer's input as the GPU stores it
    const auto dw0 = random(DType::F32, s.OC * s.C, 98), db0 = random(DType::F32, s.OC, 99);
    std::vector<float> dpre(pre.size()), dw = dw0, db = db0;
    k::linear_backward_gelu(view(dpre, {s.N, s.C}), view(dw, {s.OC, s.C}), view(db, {s.OC}),
                            view(dy, {s.N, s.OC}), view(x, {s.N, s.C}), view(w, {s.OC, s.C}),
                            view(pre, {s.N, s.C}));
    const Tensor gdpre = gpu.poisoned({s.N, s.C}, dt());
    const Tensor gdw = gpu.upload(dw0, {s.OC, s.C}, DType::F32);
    const Tensor gdb = gpu.upload(db0, {s.OC}, DType::F32);
    k::linear_backward_gelu(gdpre, gdw, gdb, gpu.upload(dy, {s.N, s.OC}, dt()),
                            gpu.upload(x, {s.N, s.C}, dt()), gpu.upload(w, {s.OC, s.C}, dt()),
                            gpu.upload(pre, {s.N, s.C}, dt()));
    // C a multiple of 8 takes cuBLASLt's DGELU epilogue; other widths the fallback.
    expect_close("dpre_gelu " + str(s), gdpre, dpre, dt());
    expect_close("dweight " + str(s), gdw, dw, dt());
    expect_close("dbias " + str(s), gdb, db, dt());
  }
}

// The op profile on the device (kernels/op_profile.h): events on the compute stream time
// each call; a step's time spans its ops; the event pool is reused from step to step.
TEST_P(CudaKernel, OpProfileTimesDeviceCalls) {
  namespace prof = kernels::op_profile;
  const int64_t N = 2048, C = 1024, OC = 4096;
  const Tensor x = gpu.upload(rand(N * C), {N, C}, dt());
  const Tensor w = gpu.upload(rand(OC * C, 0.1), {OC, C}, dt());
  const Tensor out = gpu.poisoned({N, OC}, dt());
  k::linear_forward(out, x, w, Tensor{});  // the shape's cuBLASLt plan, made on the host
  prof::reset();
  for (int step = 0; step < 3; ++step) {
    prof::begin_step(true);
    for (int call = 0; call < 4; ++call) k::linear_forward(out, x, w, Tensor{});
    prof::end_step();
  }
  const prof::Profile p = prof::collect();
  ASSERT_EQ(p.ops.size(), 1u);
  const prof::OpTime& row = p.ops[0];
  EXPECT_EQ(row.op, "linear_forward");
  EXPECT_EQ(row.calls, 12);
  EXPECT_DOUBLE_EQ(row.flops, 12 * 2.0 * N * C * OC);
  EXPECT_GT(row.seconds, 0);
  EXPECT_LE(row.seconds, p.step_seconds * (1 + 1e-3));
  // A 2048 x 1024 x 4096 GEMM runs above 10 TFLOP/s on any GPU pentad targets: the events
  // time the device, not the host's enqueueing alone.
  EXPECT_GT(row.flops / row.seconds, 10e12) << prof::report(p, 0);
  prof::reset();
}

}  // namespace
}  // namespace pentad::cuda_kernels
