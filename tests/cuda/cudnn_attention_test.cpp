// cuDNN's fused attention (kernels/cuda/attention_cudnn.cpp) against pentad's own CUDA
// attention kernel, the reference (itself checked against the CPU in
// cuda_kernels_attention_test.cpp): forward out and lse, and dq, dk, dv, at odd sequence
// lengths (1, 7, 129, 1000), MHA, GQA 4:1 and 8:1 and MQA, head sizes 64 and 128; F32 calls
// staged through BF16; the accumulating backward; the graph cache; and which calls the door
// sends to cuDNN. Heads wider than 128 (136, 160, 192, 256: cuDNN 9 takes up to 256 on
// Hopper) against the CPU reference directly, so that a fault of pentad's wide-head kernel
// cannot hide one of cuDNN's. Part of cuda_kernels_test; skipped without a CUDA device like
// the rest of it.
//
// Tolerances (largest error over the largest reference value, as cuda_kernels_test). Both
// read the same BF16 inputs and keep scores, softmax statistics and accumulators in F32.
// Pentad rounds only its outputs to BF16 (2^-9 relative, 2e-3). cuDNN also rounds the
// probabilities P to BF16 before P V (forward), and P and dS = P (dP - D) before P^T dO,
// dS K and dS^T Q (backward): one more 2^-9 rounding per factor of every product. With
// random signs those errors partly cancel in the sums; at worst they add to 2^-9 of the
// sum of |terms|, which for these N(0, 1) inputs stays within a few times the largest
// result. Hence 1e-2 for out (five BF16 roundings' worth) and 2e-2 for the gradients (dS
// is a difference of nearly equal sums at long T, so its rounding weighs more). lse is
// F32 from identical inputs on both sides, only the summation order differs: 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/ops.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace pentad {
namespace {

namespace k = kernels;
using testing::rel_error;

constexpr double kOutTolerance = 1e-2, kGradTolerance = 2e-2, kLseTolerance = 1e-4;

// Sets the attention implementation for one scope.
class Impl {
 public:
  explicit Impl(k::AttentionImpl impl) : saved_(k::attention_impl()) {
    k::set_attention_impl(impl);
  }
  ~Impl() { k::set_attention_impl(saved_); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

 private:
  k::AttentionImpl saved_;
};

using testing::download;
using testing::Gpu;

void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double tol) {
  const std::vector<float> g = download(got), w = download(want);
  size_t non_finite = 0;
  for (float x : g) non_finite += std::isfinite(x) ? 0 : 1;
  EXPECT_EQ(non_finite, 0u) << what << ": non-finite values (an unwritten output stays NaN)";
  EXPECT_LT(rel_error(g, w, 1e-6), tol) << what;
}

struct Case {
  int64_t B, T, Hq, Hkv, D;
  Shape q() const { return {B, T, Hq, D}; }
  Shape kv() const { return {B, T, Hkv, D}; }
  Shape lse() const { return {B, Hq, T}; }
  std::string str() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " Hq " + std::to_string(Hq) +
           " Hkv " + std::to_string(Hkv) + " D " + std::to_string(D);
  }
};

// Every sequence length with both head sizes; MHA, GQA 4:1 and 8:1, MQA (8:1 with one kv head).
const Case kCases[] = {{2, 1, 8, 8, 64},     {2, 1, 8, 2, 128},    {1, 7, 8, 2, 64},
                       {2, 7, 16, 2, 128},   {2, 129, 8, 1, 64},   {1, 129, 12, 12, 128},
                       {1, 1000, 16, 2, 64}, {1, 1000, 8, 8, 128}, {1, 1000, 4, 1, 128}};

bool have_device() {
  return cuda_device_count() > 0;
}

class CudnnAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
  Gpu gpu;
};

// The inputs of one case, and pentad's kernel's results on them (the reference).
struct Reference {
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};

Reference reference(Gpu& gpu, const Case& c, DType dt, uint64_t seed) {
  Reference r;
  r.q = gpu.random(c.q(), dt, seed);
  r.k = gpu.random(c.kv(), dt, seed + 1);
  r.v = gpu.random(c.kv(), dt, seed + 2);
  r.dout = gpu.random(c.q(), dt, seed + 3);
  r.out = gpu.poisoned(c.q(), dt);
  r.lse = gpu.poisoned(c.lse(), DType::F32);
  r.dq = gpu.poisoned(c.q(), dt);
  r.dk = gpu.poisoned(c.kv(), dt);
  r.dv = gpu.poisoned(c.kv(), dt);
  Impl pentad(k::AttentionImpl::Pentad);
  k::attention_forward(r.out, r.lse, r.q, r.k, r.v);
  k::attention_backward(r.dq, r.dk, r.dv, r.dout, r.q, r.k, r.v, r.out, r.lse);
  return r;
}

TEST_F(CudnnAttention, MatchesPentadKernelInBf16) {
  Impl cudnn(k::AttentionImpl::Cudnn);
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.str());
    // cuDNN 9 on an H200 refuses the backward at T = 1 ("s_q = s_kv = 1 is not supported",
    // 2026-11-27): "auto" then takes pentad's kernel (TheDoorPicksByImplDtypeAndPositions),
    // "cudnn" refuses the recipe. Every other shape must be taken, both ways.
    bool taken[2];
    for (bool backward : {false, true}) {
      std::string why;
      taken[backward] =
          k::cuda::cudnn_attention_supported(backward, c.B, c.T, c.Hq, c.Hkv, c.D, &why);
      if (!taken[backward]) {
        std::printf("cuDNN refuses the %s at %s: %s\n", backward ? "backward" : "forward",
                    c.str().c_str(), why.c_str());
        EXPECT_TRUE(backward && c.T == 1) << "cuDNN refuses a shape it should take";
      }
    }
    if (!taken[0]) continue;
    const Reference r = reference(gpu, c, DType::BF16, seed += 10);
    const Tensor out = gpu.poisoned(c.q(), DType::BF16), lse = gpu.poisoned(c.lse(), DType::F32);
    k::attention_forward(out, lse, r.q, r.k, r.v);
    expect_close("out", out, r.out, kOutTolerance);
    expect_close("lse", lse, r.lse, kLseTolerance);
    // The backward from the reference's out and lse, so that only the backward differs;
    // twice, to see it is deterministic (training is bitwise reproducible).
    if (!taken[1]) continue;
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      const Tensor dq = gpu.poisoned(c.q(), DType::BF16), dk = gpu.poisoned(c.kv(), DType::BF16),
                   dv = gpu.poisoned(c.kv(), DType::BF16);
      k::attention_backward(dq, dk, dv, r.dout, r.q, r.k, r.v, r.out, r.lse);
      const Tensor got[3] = {dq, dk, dv}, want[3] = {r.dq, r.dk, r.dv};
      const char* names[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) {
          expect_close(names[i], got[i], want[i], kGradTolerance);
          first[i] = download(got[i]);
        } else {
          const std::vector<float> again = download(got[i]);
          EXPECT_EQ(0, std::memcmp(first[i].data(), again.data(), again.size() * sizeof(float)))
              << names[i] << ": cuDNN's backward is not deterministic";
        }
      }
    }
  }
}

// Heads wider than 128 against the CPU (fp32 on the same BF16-rounded inputs; the backward
// from the CPU's out, rounded to BF16 as a GPU forward would store it, and lse): causal,
// MHA, GQA and MQA, T = 1 (forward only: cuDNN refuses the backward there), 7, 129 and 300
// (not multiples of any tile). On Hopper cuDNN must take every other shape both ways whose
// head_dim is a multiple of 16 (the frontend's check for sm_90 asks for head_dim <= 256, a
// multiple of 8); elsewhere a refusal is printed and the shape skipped ("auto" falls back to
// pentad's kernel).
TEST_F(CudnnAttention, WideHeadsMatchTheCpu) {
  const bool hopper = cuda_device_description().find("sm_90") != std::string::npos;
  Impl cudnn(k::AttentionImpl::Cudnn);
  const Case cases[] = {{1, 1, 4, 2, 160},   {2, 7, 4, 1, 136},    {1, 129, 8, 2, 160},
                        {1, 129, 4, 4, 192}, {2, 300, 4, 1, 160},  {1, 300, 8, 8, 256},
                        {1, 7, 2, 2, 256},   {1, 129, 16, 2, 256}, {1, 300, 4, 2, 192}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    bool taken[2];
    for (bool backward : {false, true}) {
      std::string why;
      taken[backward] =
          k::cuda::cudnn_attention_supported(backward, c.B, c.T, c.Hq, c.Hkv, c.D, &why);
      if (!taken[backward]) {
        std::printf("cuDNN refuses the %s at %s: %s\n", backward ? "backward" : "forward",
                    c.str().c_str(), why.c_str());
        // 136 is a multiple of 8 but not of 16: the frontend lets it through on sm_90, whether
        // the library has an engine for it is what this run shows.
        if (hopper && c.D % 16 == 0) {
          EXPECT_TRUE(backward && c.T == 1) << "cuDNN refuses a shape it should take";
        }
      }
    }
    if (!taken[0]) continue;
    // BF16-representable inputs on both sides.
    auto bf16_values = [&](int64_t n) {
      std::vector<float> v = testing::to_float(testing::randn(static_cast<size_t>(n), seed++));
      for (float& x : v) x = bf16_to_float(float_to_bf16(x));
      return v;
    };
    const auto q = bf16_values(c.q().numel()), kk = bf16_values(c.kv().numel()),
               v = bf16_values(c.kv().numel()), dy = bf16_values(c.q().numel());
    std::vector<float> out(q.size()), lse(static_cast<size_t>(c.lse().numel()));
    k::attention_forward(testing::view(out, c.q()), testing::view(lse, c.lse()),
                         testing::view(q, c.q()), testing::view(kk, c.kv()),
                         testing::view(v, c.kv()));
    const Tensor gq = gpu.upload(q, c.q(), DType::BF16), gk = gpu.upload(kk, c.kv(), DType::BF16),
                 gv = gpu.upload(v, c.kv(), DType::BF16);
    const Tensor gout = gpu.poisoned(c.q(), DType::BF16), glse = gpu.poisoned(c.lse(), DType::F32);
    k::attention_forward(gout, glse, gq, gk, gv);
    auto close = [&](const char* what, const Tensor& got, const std::vector<float>& want,
                     double tol) {
      const std::vector<float> g = download(got);
      size_t non_finite = 0;
      for (float x : g) non_finite += std::isfinite(x) ? 0 : 1;
      EXPECT_EQ(non_finite, 0u) << what << ": non-finite values (an unwritten output stays NaN)";
      EXPECT_LT(rel_error(g, want, 1e-6), tol) << what;
    };
    close("out", gout, out, kOutTolerance);
    close("lse", glse, lse, kLseTolerance);
    if (!taken[1]) continue;
    for (float& x : out) x = bf16_to_float(float_to_bf16(x));
    std::vector<float> dq(q.size()), dk(kk.size()), dv(v.size());
    k::attention_backward(
        testing::view(dq, c.q()), testing::view(dk, c.kv()), testing::view(dv, c.kv()),
        testing::view(dy, c.q()), testing::view(q, c.q()), testing::view(kk, c.kv()),
        testing::view(v, c.kv()), testing::view(out, c.q()), testing::view(lse, c.lse()));
    const Tensor gdq = gpu.poisoned(c.q(), DType::BF16), gdk = gpu.poisoned(c.kv(), DType::BF16),
                 gdv = gpu.poisoned(c.kv(), DType::BF16);
    k::attention_backward(gdq, gdk, gdv, gpu.upload(dy, c.q(), DType::BF16), gq, gk, gv,
                          gpu.upload(out, c.q(), DType::BF16),
                          gpu.upload(lse, c.lse(), DType::F32));
    close("dq", gdq, dq, kGradTolerance);
    close("dk", gdk, dk, kGradTolerance);
    close("dv", gdv, dv, kGradTolerance);
  }
}

// F32 data under "cudnn": staged through BF16 copies; and the accumulating backward (on
// F32 and BF16) adds to what the gradients held.
TEST_F(CudnnAttention, F32StagingAndAccumulation) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Case c{2, 129, 8, 2, 64};
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Reference r = reference(gpu, c, dt, 7);
    Impl cudnn(k::AttentionImpl::Cudnn);
    if (dt == DType::F32) {
      const Tensor out = gpu.poisoned(c.q(), dt), lse = gpu.poisoned(c.lse(), DType::F32);
      k::attention_forward(out, lse, r.q, r.k, r.v);
      expect_close("out", out, r.out, kOutTolerance);
      // cuDNN sees q and k rounded to BF16, the reference does not: the scores, and so lse,
      // carry BF16's rounding (1.0e-3 on an H200, 2026-11-27), not kLseTolerance's.
      expect_close("lse", lse, r.lse, kOutTolerance);
      const Tensor out_no_lse = gpu.poisoned(c.q(), dt);  // lse is optional (ops.h)
      k::attention_forward(out_no_lse, Tensor{}, r.q, r.k, r.v);
      expect_close("out without lse", out_no_lse, r.out, kOutTolerance);
    }
    // start + gradient, by both implementations.
    const Tensor start[3] = {gpu.random(c.q(), dt, 50), gpu.random(c.kv(), dt, 51),
                             gpu.random(c.kv(), dt, 52)};
    Tensor mine[3], ref[3];
    for (int i = 0; i < 3; ++i) {
      mine[i] = gpu.clone(start[i]);
      ref[i] = gpu.clone(start[i]);
    }
    k::attention_backward(mine[0], mine[1], mine[2], r.dout, r.q, r.k, r.v, r.out, r.lse, {}, {},
                          true);
    {
      Impl pentad(k::AttentionImpl::Pentad);
      k::attention_backward(ref[0], ref[1], ref[2], r.dout, r.q, r.k, r.v, r.out, r.lse, {}, {},
                            true);
    }
    const char* names[3] = {"dq accumulated", "dk accumulated", "dv accumulated"};
    for (int i = 0; i < 3; ++i) expect_close(names[i], mine[i], ref[i], kGradTolerance);
  }
}

// A graph is built once per (direction, shape): the second call of a shape builds none.
TEST_F(CudnnAttention, GraphsAreBuiltOncePerShape) {
  Impl cudnn(k::AttentionImpl::Cudnn);
  const Case c{1, 77, 4, 2, 64};  // a shape no other test uses
  const Reference r = reference(gpu, c, DType::BF16, 3);
  auto forward = [&] {
    k::attention_forward(gpu.alloc(c.q(), DType::BF16), gpu.alloc(c.lse(), DType::F32), r.q, r.k,
                         r.v);
  };
  auto backward = [&] {
    k::attention_backward(gpu.alloc(c.q(), DType::BF16), gpu.alloc(c.kv(), DType::BF16),
                          gpu.alloc(c.kv(), DType::BF16), r.dout, r.q, r.k, r.v, r.out, r.lse);
  };
  const int64_t before = k::cuda::cudnn_attention_graphs_built();
  forward();
  EXPECT_EQ(k::cuda::cudnn_attention_graphs_built(), before + 1) << "the first forward builds";
  forward();
  EXPECT_EQ(k::cuda::cudnn_attention_graphs_built(), before + 1) << "the second forward builds";
  backward();
  EXPECT_EQ(k::cuda::cudnn_attention_graphs_built(), before + 2) << "the first backward builds";
  backward();
  backward();
  EXPECT_EQ(k::cuda::cudnn_attention_graphs_built(), before + 2) << "a later backward builds";
}

// The door's choice (ops.h, AttentionImpl), seen through the graph count: a call that goes
// to cuDNN with a new shape builds a graph, one that stays on pentad's kernel builds none.
TEST_F(CudnnAttention, TheDoorPicksByImplDtypeAndPositions) {
  int64_t T = 40;  // each probe a fresh shape
  auto probe = [&](k::AttentionImpl impl, DType dt, bool positions, int64_t D) {
    Impl scope(impl);
    const Case c{1, ++T, 4, 2, D};
    const Tensor q = gpu.random(c.q(), dt, 1), kk = gpu.random(c.kv(), dt, 2),
                 v = gpu.random(c.kv(), dt, 3);
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    Tensor p;
    if (positions) {
      p = gpu.alloc({c.T}, DType::I32);
      copy_bytes(p.data, Device::CUDA, pos.data(), Device::CPU, p.bytes());
    }
    const int64_t before = k::cuda::cudnn_attention_graphs_built();
    k::attention_forward(gpu.alloc(c.q(), dt), gpu.alloc(c.lse(), DType::F32), q, kk, v, p, p);
    return k::cuda::cudnn_attention_graphs_built() - before;
  };
  using I = k::AttentionImpl;
  EXPECT_EQ(probe(I::Auto, DType::BF16, false, 64), 1) << "auto, bf16: cuDNN";
  EXPECT_EQ(probe(I::Auto, DType::F32, false, 64), 0) << "auto, f32: pentad's kernel";
  EXPECT_EQ(probe(I::Auto, DType::BF16, false, 12), 0) << "auto, head_dim 12: pentad's kernel";
  // Wide heads: cuDNN where it takes them (Hopper: multiples of 8 up to 256), pentad's
  // kernel for the rest, which runs: "auto" falls back.
  if (cuda_device_description().find("sm_90") != std::string::npos) {
    EXPECT_EQ(probe(I::Auto, DType::BF16, false, 160), 1) << "auto, head_dim 160: cuDNN";
  }
  EXPECT_EQ(probe(I::Auto, DType::BF16, false, 132), 0) << "auto, head_dim 132: pentad's kernel";
  EXPECT_EQ(probe(I::Auto, DType::F32, false, 256), 0) << "auto, f32, head_dim 256: pentad's";
  EXPECT_EQ(probe(I::Auto, DType::BF16, true, 64), 0) << "positions: pentad's kernel";
  EXPECT_EQ(probe(I::Pentad, DType::BF16, false, 64), 0) << "pentad: pentad's kernel";
  EXPECT_EQ(probe(I::Cudnn, DType::F32, false, 64), 1) << "cudnn, f32: cuDNN";
  EXPECT_EQ(probe(I::Cudnn, DType::BF16, true, 64), 0) << "cudnn with positions: pentad's";
  EXPECT_THROW(probe(I::Cudnn, DType::BF16, false, 12), Error) << "cudnn refuses head_dim 12";
}

}  // namespace
}  // namespace pentad
