// cuda_kernels_test: rope and pentad's attention kernels against the CPU: forward,
// backward and its determinism, by position (context parallelism) and the merge of
// blocks (the program, its fixtures and bounds: cuda_kernels_test.h; cuDNN's attention:
// cudnn_attention_test.cpp).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/cuda_kernels_test.h"

namespace pentad::cuda_kernels {
namespace {

// ---- rope ----

TEST_P(CudaKernel, Rope) {
  struct RopeCase {
    int64_t B, T, H, D, pos_offset;
    float theta;
  };
  const RopeCase cases[] = {{1, 1, 1, 2, 0, 10000.0f},
                            {2, 7, 3, 8, 17, 10000.0f},
                            {1, 300, 4, 64, 0, 500000.0f},
                            {2, 33, 2, 128, 4000, 10000.0f},
                            {1, 5, 3, 6, 0, 10000.0f}};
  for (const RopeCase& c : cases)
    for (bool inverse : {false, true}) {
      const Shape shape{c.B, c.T, c.H, c.D};
      const auto x = rand(shape.numel());
      std::vector<float> want = x;
      const Tensor gx = gpu.upload(x, shape, dt());
      if (inverse) {
        k::rope_backward(view(want, shape), c.pos_offset, c.theta);
        k::rope_backward(gx, c.pos_offset, c.theta);
      } else {
        k::rope_forward(view(want, shape), c.pos_offset, c.theta);
        k::rope_forward(gx, c.pos_offset, c.theta);
      }
      expect_close("rope " + shape.str() + " offset " + std::to_string(c.pos_offset) +
                       (inverse ? " inverse" : ""),
                   gx, want, dt());
    }
}

// Zig-zag chunks (r and 2R-1-r of 2R), a position repeated, and positions past T.
TEST_P(CudaKernel, RopeWithPositions) {
  const std::vector<int32_t> position_sets[] = {
      {8, 9, 10, 11, 36, 37, 38, 39}, {0, 0, 1, 5, 5, 4000}, {7}};
  for (const auto& pos : position_sets)
    for (bool inverse : {false, true}) {
      const int64_t T = static_cast<int64_t>(pos.size());
      const Shape shape{2, T, 3, 64};
      const auto x = rand(shape.numel());
      std::vector<float> want = x;
      const Tensor gx = gpu.upload(x, shape, dt());
      const Tensor gpos = gpu.upload_ids(pos, {T});
      auto apply = inverse ? k::rope_backward : k::rope_forward;
      apply(view(want, shape), 0, 10000.0f, view(pos, {T}));
      apply(gx, 0, 10000.0f, gpos);
      expect_close("rope positions T " + std::to_string(T) + (inverse ? " inverse" : ""), gx, want,
                   dt());
    }
}

// ---- attention ----

struct AttnShape {
  int64_t B, T, Hq, Hkv, D;
  Shape q() const { return {B, T, Hq, D}; }
  Shape kv() const { return {B, T, Hkv, D}; }
  Shape lse() const { return {B, Hq, T}; }
  std::string str() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " Hq " + std::to_string(Hq) +
           " Hkv " + std::to_string(Hkv) + " D " + std::to_string(D);
  }
};
// T around the 32-row tile (1, 31, 32, 33, 65, 150); GQA, MQA and MHA; head_dim odd, below
// and at 64, between 64 and 128, and 128; then the heads wider than 128, whose output cells
// live in shared memory (tiling.h): 129 (the first), 136, 160 (the 530B and 1T GPT
// configurations), 192, 200 (not a multiple of 8, cuDNN's requirement) and 256 (the largest).
const AttnShape kAttnShapes[] = {
    {2, 9, 4, 2, 8},     {1, 1, 2, 2, 4},     {2, 31, 2, 1, 16},  {2, 32, 4, 4, 16},
    {1, 33, 3, 1, 96},   {1, 65, 4, 1, 5},    {2, 70, 6, 3, 32},  {1, 150, 2, 1, 64},
    {1, 100, 2, 2, 128}, {2, 64, 12, 12, 64}, {1, 40, 2, 1, 129}, {1, 1, 2, 2, 160},
    {2, 33, 4, 2, 136},  {1, 97, 4, 1, 160},  {2, 31, 2, 2, 192}, {1, 70, 6, 3, 200},
    {1, 150, 2, 1, 256}, {2, 64, 4, 4, 256},  {1, 33, 8, 1, 256}};

// Pentad's kernel (cuDNN's, which "auto" would pick for BF16, is checked against it in
// cudnn_attention_test.cpp).
class PentadAttention {
 public:
  PentadAttention() : saved_(k::attention_impl()) {
    k::set_attention_impl(k::AttentionImpl::Pentad);
  }
  ~PentadAttention() { k::set_attention_impl(saved_); }

 private:
  k::AttentionImpl saved_;
};

TEST_P(CudaKernel, AttentionForward) {
  const PentadAttention pentad;
  for (AttnShape s : kAttnShapes) {
    const auto q = rand(s.q().numel()), kk = rand(s.kv().numel()), v = rand(s.kv().numel());
    std::vector<float> out(s.q().numel()), lse(s.lse().numel());
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()));
    const Tensor gout = gpu.poisoned(s.q(), dt()), glse = gpu.poisoned(s.lse(), DType::F32);
    k::attention_forward(gout, glse, gpu.upload(q, s.q(), dt()), gpu.upload(kk, s.kv(), dt()),
                         gpu.upload(v, s.kv(), dt()));
    expect_close("attention out " + s.str(), gout, out, dt());
    expect_close("attention lse " + s.str(), glse, lse, dt());
    // lse is optional.
    const Tensor gout2 = gpu.poisoned(s.q(), dt());
    k::attention_forward(gout2, Tensor{}, gpu.upload(q, s.q(), dt()), gpu.upload(kk, s.kv(), dt()),
                         gpu.upload(v, s.kv(), dt()));
    expect_close("attention out without lse " + s.str(), gout2, out, dt());
  }
}

TEST_P(CudaKernel, AttentionBackward) {
  const PentadAttention pentad;
  for (AttnShape s : kAttnShapes) {
    const auto q = rand(s.q().numel()), kk = rand(s.kv().numel()), v = rand(s.kv().numel());
    const auto dy = rand(s.q().numel());
    std::vector<float> out(s.q().numel()), lse(s.lse().numel());
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()));
    out = rounded(dt(), out);  // what the GPU would have stored
    std::vector<float> dq(q.size()), dk(kk.size()), dv(v.size());
    k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(dy, s.q()),
                          view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                          view(lse, s.lse()));
    const Tensor gq = gpu.upload(q, s.q(), dt()), gk = gpu.upload(kk, s.kv(), dt());
    const Tensor gv = gpu.upload(v, s.kv(), dt()), gdy = gpu.upload(dy, s.q(), dt());
    const Tensor gout = gpu.upload(out, s.q(), dt()), glse = gpu.upload(lse, s.lse(), DType::F32);
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      const Tensor gdq = gpu.poisoned(s.q(), dt()), gdk = gpu.poisoned(s.kv(), dt());
      const Tensor gdv = gpu.poisoned(s.kv(), dt());
      k::attention_backward(gdq, gdk, gdv, gdy, gq, gk, gv, gout, glse);
      const std::vector<float> got[3] = {download(gdq), download(gdk), download(gdv)};
      if (run == 0) {
        // dq and dk against dv's scale: with one key (T = 1) the softmax is constant, so dq
        // and dk are exactly zero and both sides hold only rounding (an H200 gave 0.1 of a
        // 1e-7 reference, 2026-11-27).
        double scale = 1e-6;
        for (float x : dv) scale = std::max(scale, double(std::abs(x)));
        expect_close("attention dq " + s.str(), got[0], dq, tolerance(dt()), scale);
        expect_close("attention dk " + s.str(), got[1], dk, tolerance(dt()), scale);
        expect_close("attention dv " + s.str(), got[2], dv, tolerance(dt()));
        for (int i = 0; i < 3; ++i) first[i] = got[i];
      } else {
        for (int i = 0; i < 3; ++i)
          EXPECT_TRUE(bitwise_equal(first[i], got[i])) << "attention backward is not "
                                                          "deterministic, gradient "
                                                       << i << " " << s.str();
      }
    }
  }
}

// ---- attention by position (context parallelism) ----

// Query rows at q_pos against key rows at k_pos, each drawn sorted and distinct from
// [first, first + span): with k_first > q_first the first query rows (a whole 32-row tile
// when the gap is wide) see no key.
struct PosAttnCase {
  int64_t B, Tq, Tk, Hq, Hkv, D, q_first, k_first, span;
  Shape q() const { return {B, Tq, Hq, D}; }
  Shape kv() const { return {B, Tk, Hkv, D}; }
  Shape lse() const { return {B, Hq, Tq}; }
  std::string str() const {
    return "B " + std::to_string(B) + " Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) +
           " Hq " + std::to_string(Hq) + " Hkv " + std::to_string(Hkv) + " D " + std::to_string(D);
  }
};
const PosAttnCase kPosAttnCases[] = {
    {2, 9, 13, 4, 2, 8, 0, 3, 20},       {1, 70, 40, 4, 1, 16, 0, 0, 100},
    {2, 130, 150, 4, 2, 8, 0, 100, 300}, {1, 65, 65, 4, 4, 64, 5, 0, 80},
    {1, 33, 100, 2, 1, 96, 50, 0, 150},  {2, 64, 64, 2, 2, 128, 0, 0, 64},
    {1, 70, 90, 4, 2, 160, 0, 40, 200},  {1, 33, 33, 2, 1, 256, 10, 0, 60},
};

std::vector<int32_t> sorted_positions(int64_t n, int64_t first, int64_t span, uint64_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(span));
  for (int64_t i = 0; i < span; ++i) all[i] = static_cast<int32_t>(first + i);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

// lse with rows no key saw: -inf exactly where the reference has it, close elsewhere.
void expect_lse_close(const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> got_finite = got, want_finite = want;
  size_t mismatched = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if ((want[i] == -INFINITY) != (got[i] == -INFINITY)) ++mismatched;
    if (want[i] == -INFINITY) got_finite[i] = want_finite[i] = 0.0f;
  }
  EXPECT_EQ(mismatched, 0u) << what << ": rows with no visible key differ";
  expect_close(what, got_finite, want_finite, tol);
}

TEST_P(CudaKernel, AttentionForwardWithPositions) {
  for (const PosAttnCase& s : kPosAttnCases) {
    const auto q_pos = sorted_positions(s.Tq, s.q_first, s.span, 1);
    const auto k_pos = sorted_positions(s.Tk, s.k_first, s.span, 2);
    const auto q = rand(s.q().numel()), kk = rand(s.kv().numel()), v = rand(s.kv().numel());
    std::vector<float> out(s.q().numel()), lse(s.lse().numel());
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
    const Tensor gout = gpu.poisoned(s.q(), dt()), glse = gpu.poisoned(s.lse(), DType::F32);
    k::attention_forward(gout, glse, gpu.upload(q, s.q(), dt()), gpu.upload(kk, s.kv(), dt()),
                         gpu.upload(v, s.kv(), dt()), gpu.upload_ids(q_pos, {s.Tq}),
                         gpu.upload_ids(k_pos, {s.Tk}));
    expect_close("positions out " + s.str(), gout, out, dt());
    expect_lse_close("positions lse " + s.str(), download(glse), lse, tolerance(dt()));
  }
}

// Positions 0..t-1 given explicitly take the same path through the kernels as none.
TEST_P(CudaKernel, AttentionExplicitPositionsGiveTheBitsOfAbsentOnes) {
  const PentadAttention pentad;  // "auto" sends BF16 without positions to cuDNN
  const AttnShape s{2, 70, 4, 2, 32};
  std::vector<int32_t> pos(s.T);
  for (int64_t t = 0; t < s.T; ++t) pos[t] = static_cast<int32_t>(t);
  const Tensor gq = gpu.upload(rand(s.q().numel()), s.q(), dt());
  const Tensor gk = gpu.upload(rand(s.kv().numel()), s.kv(), dt());
  const Tensor gv = gpu.upload(rand(s.kv().numel()), s.kv(), dt());
  const Tensor gdy = gpu.upload(rand(s.q().numel()), s.q(), dt());
  const Tensor gpos = gpu.upload_ids(pos, {s.T});
  std::vector<float> got[2][5];
  for (int with_pos = 0; with_pos < 2; ++with_pos) {
    const Tensor p = with_pos ? gpos : Tensor{};
    const Tensor out = gpu.poisoned(s.q(), dt()), lse = gpu.poisoned(s.lse(), DType::F32);
    k::attention_forward(out, lse, gq, gk, gv, p, p);
    const Tensor dq = gpu.poisoned(s.q(), dt()), dk = gpu.poisoned(s.kv(), dt()),
                 dv = gpu.poisoned(s.kv(), dt());
    k::attention_backward(dq, dk, dv, gdy, gq, gk, gv, out, lse, p, p);
    const Tensor all[5] = {out, lse, dq, dk, dv};
    for (int i = 0; i < 5; ++i) got[with_pos][i] = download(all[i]);
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(bitwise_equal(got[0][i], got[1][i])) << "output " << i;
}

// One block's backward, overwriting (from NaN) and accumulating (from random values), with
// the final out/lse the CPU computed.
TEST_P(CudaKernel, AttentionBackwardWithPositions) {
  for (const PosAttnCase& s : kPosAttnCases) {
    const auto q_pos = sorted_positions(s.Tq, s.q_first, s.span, 3);
    const auto k_pos = sorted_positions(s.Tk, s.k_first, s.span, 4);
    const auto q = rand(s.q().numel()), kk = rand(s.kv().numel()), v = rand(s.kv().numel());
    const auto dy = rand(s.q().numel());
    std::vector<float> out(s.q().numel()), lse(s.lse().numel());
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
    out = rounded(dt(), out);  // what the GPU would have stored
    const Tensor gq = gpu.upload(q, s.q(), dt()), gk = gpu.upload(kk, s.kv(), dt());
    const Tensor gv = gpu.upload(v, s.kv(), dt()), gdy = gpu.upload(dy, s.q(), dt());
    const Tensor gout = gpu.upload(out, s.q(), dt()), glse = gpu.upload(lse, s.lse(), DType::F32);
    const Tensor gq_pos = gpu.upload_ids(q_pos, {s.Tq}), gk_pos = gpu.upload_ids(k_pos, {s.Tk});
    for (bool accumulate : {false, true}) {
      std::vector<float> dq(q.size(), 0.0f), dk(kk.size(), 0.0f), dv(v.size(), 0.0f);
      if (accumulate) dq = rand(dq.size()), dk = rand(dk.size()), dv = rand(dv.size());
      const Tensor gdq = accumulate ? gpu.upload(dq, s.q(), dt()) : gpu.poisoned(s.q(), dt());
      const Tensor gdk = accumulate ? gpu.upload(dk, s.kv(), dt()) : gpu.poisoned(s.kv(), dt());
      const Tensor gdv = accumulate ? gpu.upload(dv, s.kv(), dt()) : gpu.poisoned(s.kv(), dt());
      k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(dy, s.q()),
                            view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                            view(lse, s.lse()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}),
                            accumulate);
      k::attention_backward(gdq, gdk, gdv, gdy, gq, gk, gv, gout, glse, gq_pos, gk_pos, accumulate);
      const std::string what = s.str() + (accumulate ? " accumulate" : "");
      expect_close("positions dq " + what, gdq, dq, dt());
      expect_close("positions dk " + what, gdk, dk, dt());
      expect_close("positions dv " + what, gdv, dv, dt());
    }
  }
}

// Running (out, lse) with rows nothing has seen yet (0, -inf), merged with a block that has
// rows it saw no key for (-inf).
TEST_P(CudaKernel, AttentionMerge) {
  const Shape shapes[] = {
      {1, 1, 1, 4}, {2, 33, 3, 16}, {1, 70, 4, 128}, {2, 9, 2, 5}, {1, 40, 2, 256}};
  for (const Shape& shape : shapes) {
    const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3];
    const Shape lse_shape{B, H, T};
    auto out = rand(shape.numel()), block = rand(shape.numel());
    auto lse = random(DType::F32, lse_shape.numel(), 5),
         block_lse = random(DType::F32, lse_shape.numel(), 6);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t at = (b * H + h) * T + t;
          if (t % 3 == 0) {  // nothing seen so far: out 0, lse -inf
            lse[at] = -INFINITY;
            std::fill_n(&out[((b * T + t) * H + h) * D], D, 0.0f);
          }
          if (t % 2 == 0) block_lse[at] = -INFINITY;
        }
    const Tensor gout = gpu.upload(out, shape, dt()), glse = gpu.upload(lse, lse_shape, DType::F32);
    k::attention_merge(view(out, shape), view(lse, lse_shape), view(block, shape),
                       view(block_lse, lse_shape));
    k::attention_merge(gout, glse, gpu.upload(block, shape, dt()),
                       gpu.upload(block_lse, lse_shape, DType::F32));
    expect_close("merge out " + shape.str(), gout, rounded(dt(), out), dt());
    expect_lse_close("merge lse " + shape.str(), download(glse), lse, 1e-5);
  }
}

}  // namespace
}  // namespace pentad::cuda_kernels
