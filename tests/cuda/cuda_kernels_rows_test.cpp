// cuda_kernels_test: the row-wise ops over (N, C) against the CPU: layer and RMS norms
// (forward, backward, the fused residual), cross-entropy and its vocab-parallel parts (the
// program, its fixtures and bounds: cuda_kernels_test.h).
#include <algorithm>
#include <string>
#include <vector>

#include "tests/cuda/cuda_kernels_test.h"

namespace pentad::cuda_kernels {
namespace {

// ---- norms ----

struct RowsShape {
  int64_t N, C;
};
const RowsShape kRowShapes[] = {{1, 1},    {3, 7},      {17, 33},  {64, 768},
                                {5, 1000}, {130, 4096}, {1000, 64}};

// The backward passes take more: each path of norms.cu's backward (tiling.h:
// norm_backward_shape), in BF16 and F32. A warp a row in 16-byte accesses (64 x 768, and
// 4100 x 768: rows not a multiple of a block's, the last block partly idle); groups of
// several warps with a barrier a row (33 x 2048: 128 threads; 7 x 8192: 512 in BF16); one
// element at a time where C is not a multiple of the access (3 x 7, 17 x 33, 9 x 1500 in
// BF16: 512 threads); rows too wide for any group (5 x 5001, 3 x 12800, 7 x 8192 in F32),
// which take the older two-kernel path.
const RowsShape kNormBackwardShapes[] = {
    {1, 1},      {3, 7},     {17, 33},  {64, 768}, {5, 1000}, {130, 4096}, {1000, 64},
    {4100, 768}, {33, 2048}, {7, 8192}, {9, 1500}, {5, 5001}, {3, 12800}};

std::string str(RowsShape s) {
  return "N " + std::to_string(s.N) + " C " + std::to_string(s.C);
}

// A tensor of `shape` one element past the start of its own allocation, so that its rows
// start off 16 bytes (kernels with 16-byte accesses must take their element-wise path):
// holding `values`, or NaN.
Tensor off_by_one(Gpu& gpu, const std::vector<float>& values, Shape shape, DType dtype) {
  std::vector<float> padded(values.size() + 1, 0.0f);
  std::copy(values.begin(), values.end(), padded.begin() + 1);
  Tensor t = gpu.upload(padded, {static_cast<int64_t>(padded.size())}, dtype);
  t.data = static_cast<char*>(t.data) + dtype_bytes(dtype);
  t.shape = shape;
  return t;
}
Tensor poisoned_off_by_one(Gpu& gpu, Shape shape, DType dtype) {
  Tensor t = gpu.poisoned({shape.numel() + 1}, dtype);
  t.data = static_cast<char*>(t.data) + dtype_bytes(dtype);
  t.shape = shape;
  return t;
}

TEST_P(CudaKernel, LayerNormForward) {
  for (RowsShape s : kRowShapes)
    for (bool with_bias : {true, false}) {
      // An offset mean checks the two-pass variance.
      auto x = rand(s.N * s.C);
      for (float& v : x) v = round_to(dt(), v + 3.0f);
      const auto w = rand(s.C), b = rand(s.C);
      std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
      k::layernorm_forward(view(out, {s.N, s.C}), view(mean, {s.N}), view(rstd, {s.N}),
                           view(x, {s.N, s.C}), view(w, {s.C}),
                           with_bias ? view(b, {s.C}) : Tensor{}, 1e-5f);
      const Tensor gout = gpu.poisoned({s.N, s.C}, dt());
      const Tensor gmean = gpu.poisoned({s.N}, DType::F32), grstd = gpu.poisoned({s.N}, DType::F32);
      k::layernorm_forward(gout, gmean, grstd, gpu.upload(x, {s.N, s.C}, dt()),
                           gpu.upload(w, {s.C}, dt()),
                           with_bias ? gpu.upload(b, {s.C}, dt()) : Tensor{}, 1e-5f);
      expect_close("layernorm out " + str(s), gout, out, dt());
      expect_close("layernorm mean " + str(s), gmean, mean, dt());
      expect_close("layernorm rstd " + str(s), grstd, rstd, dt());
    }
}

// The fused kernel equals add() then the norm, with the residual rounded to the data type
// in between (as the GPU stores it).
TEST_P(CudaKernel, ResidualNormsForward) {
  for (RowsShape s : kRowShapes)
    for (bool rms : {false, true}) {
      const auto a = rand(s.N * s.C), b = rand(s.N * s.C), w = rand(s.C), bias = rand(s.C);
      std::vector<float> residual(s.N * s.C), out(s.N * s.C), mean(s.N), rstd(s.N);
      k::add(view(residual, {s.N, s.C}), view(a, {s.N, s.C}), view(b, {s.N, s.C}));
      residual = rounded(dt(), residual);
      if (rms)
        k::rmsnorm_forward(view(out, {s.N, s.C}), view(rstd, {s.N}), view(residual, {s.N, s.C}),
                           view(w, {s.C}), 1e-5f);
      else
        k::layernorm_forward(view(out, {s.N, s.C}), view(mean, {s.N}), view(rstd, {s.N}),
                             view(residual, {s.N, s.C}), view(w, {s.C}), view(bias, {s.C}), 1e-5f);
      const Tensor gres = gpu.poisoned({s.N, s.C}, dt()), gout = gpu.poisoned({s.N, s.C}, dt());
      const Tensor grstd = gpu.poisoned({s.N}, DType::F32);
      const Tensor ga = gpu.upload(a, {s.N, s.C}, dt()), gb = gpu.upload(b, {s.N, s.C}, dt());
      if (rms)
        k::residual_rmsnorm_forward(gres, gout, grstd, ga, gb, gpu.upload(w, {s.C}, dt()), 1e-5f);
      else
        k::residual_layernorm_forward(gres, gout, Tensor{}, grstd, ga, gb,
                                      gpu.upload(w, {s.C}, dt()), gpu.upload(bias, {s.C}, dt()),
                                      1e-5f);
      const std::string what = std::string(rms ? "rmsnorm " : "layernorm ") + str(s);
      expect_close("residual " + what, gres, residual, dt());
      expect_close("out " + what, gout, out, dt());
      expect_close("rstd " + what, grstd, rstd, dt());
    }
}

// The residual may be written over its first input (residual += branch).
TEST_P(CudaKernel, ResidualNormInPlace) {
  const RowsShape s{37, 300};
  const auto a = rand(s.N * s.C), b = rand(s.N * s.C), w = rand(s.C);
  std::vector<float> residual(s.N * s.C), out(s.N * s.C);
  k::add(view(residual, {s.N, s.C}), view(a, {s.N, s.C}), view(b, {s.N, s.C}));
  residual = rounded(dt(), residual);
  k::rmsnorm_forward(view(out, {s.N, s.C}), Tensor{}, view(residual, {s.N, s.C}), view(w, {s.C}),
                     1e-6f);
  const Tensor ga = gpu.upload(a, {s.N, s.C}, dt()), gout = gpu.poisoned({s.N, s.C}, dt());
  k::residual_rmsnorm_forward(ga, gout, Tensor{}, ga, gpu.upload(b, {s.N, s.C}, dt()),
                              gpu.upload(w, {s.C}, dt()), 1e-6f);
  expect_close("residual in place", ga, residual, dt());
  expect_close("out", gout, out, dt());
}

TEST_P(CudaKernel, LayerNormBackward) {
  for (RowsShape s : kNormBackwardShapes) {
    const auto x = rand(s.N * s.C), w = rand(s.C), dy = rand(s.N * s.C), dx0 = rand(s.N * s.C);
    const auto dw0 = random(DType::F32, s.C, 93), db0 = random(DType::F32, s.C, 94);
    std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
    k::layernorm_forward(view(out, {s.N, s.C}), view(mean, {s.N}), view(rstd, {s.N}),
                         view(x, {s.N, s.C}), view(w, {s.C}), Tensor{}, 1e-5f);
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    k::layernorm_backward(view(dx, {s.N, s.C}), view(dw, {s.C}), view(db, {s.C}),
                          view(dy, {s.N, s.C}), view(x, {s.N, s.C}), view(w, {s.C}),
                          view(mean, {s.N}), view(rstd, {s.N}));
    const Tensor gdx = gpu.upload(dx0, {s.N, s.C}, dt());
    const Tensor gdw = gpu.upload(dw0, {s.C}, DType::F32), gdb = gpu.upload(db0, {s.C}, DType::F32);
    k::layernorm_backward(gdx, gdw, gdb, gpu.upload(dy, {s.N, s.C}, dt()),
                          gpu.upload(x, {s.N, s.C}, dt()), gpu.upload(w, {s.C}, dt()),
                          gpu.upload(mean, {s.N}, DType::F32), gpu.upload(rstd, {s.N}, DType::F32));
    expect_close("layernorm dinp " + str(s), gdx, dx, dt());
    expect_close("layernorm dweight " + str(s), gdw, dw, dt());
    expect_close("layernorm dbias " + str(s), gdb, db, dt());
  }
}

TEST_P(CudaKernel, RmsNormForwardAndBackward) {
  for (RowsShape s : kNormBackwardShapes) {
    const auto x = rand(s.N * s.C), w = rand(s.C), dy = rand(s.N * s.C), dx0 = rand(s.N * s.C);
    const auto dw0 = random(DType::F32, s.C, 95);
    std::vector<float> out(s.N * s.C), rstd(s.N);
    k::rmsnorm_forward(view(out, {s.N, s.C}), view(rstd, {s.N}), view(x, {s.N, s.C}),
                       view(w, {s.C}), 1e-6f);
    const Tensor gx = gpu.upload(x, {s.N, s.C}, dt()), gw = gpu.upload(w, {s.C}, dt());
    const Tensor gout = gpu.poisoned({s.N, s.C}, dt()), grstd = gpu.poisoned({s.N}, DType::F32);
    k::rmsnorm_forward(gout, grstd, gx, gw, 1e-6f);
    expect_close("rmsnorm out " + str(s), gout, out, dt());
    expect_close("rmsnorm rstd " + str(s), grstd, rstd, dt());

    std::vector<float> dx = dx0, dw = dw0;
    k::rmsnorm_backward(view(dx, {s.N, s.C}), view(dw, {s.C}), view(dy, {s.N, s.C}),
                        view(x, {s.N, s.C}), view(w, {s.C}), view(rstd, {s.N}));
    const Tensor gdx = gpu.upload(dx0, {s.N, s.C}, dt()), gdw = gpu.upload(dw0, {s.C}, DType::F32);
    k::rmsnorm_backward(gdx, gdw, gpu.upload(dy, {s.N, s.C}, dt()), gx, gw,
                        gpu.upload(rstd, {s.N}, DType::F32));
    expect_close("rmsnorm dinp " + str(s), gdx, dx, dt());
    expect_close("rmsnorm dweight " + str(s), gdw, dw, dt());
  }
}

// Tensors whose rows start off 16 bytes (C a multiple of the access) take the backward's
// element-wise path; without dinp, or without the parameter gradients, the rest is the same;
// and two calls give the same bits (no atomics: the partial sums add in a fixed order).
TEST_P(CudaKernel, NormBackwardOffsetTensorsAbsentOutputsAndDeterminism) {
  const RowsShape s{37, 768};
  const auto x = rand(s.N * s.C), w = rand(s.C), dy = rand(s.N * s.C), dx0 = rand(s.N * s.C);
  const auto dw0 = random(DType::F32, s.C, 96), db0 = random(DType::F32, s.C, 97);
  std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
  k::layernorm_forward(view(out, {s.N, s.C}), view(mean, {s.N}), view(rstd, {s.N}),
                       view(x, {s.N, s.C}), view(w, {s.C}), Tensor{}, 1e-5f);
  for (bool rms : {false, true}) {
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    if (rms)
      k::rmsnorm_backward(view(dx, {s.N, s.C}), view(dw, {s.C}), view(dy, {s.N, s.C}),
                          view(x, {s.N, s.C}), view(w, {s.C}), view(rstd, {s.N}));
    else
      k::layernorm_backward(view(dx, {s.N, s.C}), view(dw, {s.C}), view(db, {s.C}),
                            view(dy, {s.N, s.C}), view(x, {s.N, s.C}), view(w, {s.C}),
                            view(mean, {s.N}), view(rstd, {s.N}));
    const Tensor gmean = gpu.upload(mean, {s.N}, DType::F32);
    const Tensor grstd = gpu.upload(rstd, {s.N}, DType::F32);
    const Tensor gw = gpu.upload(w, {s.C}, dt());
    // Offset: dout, inp and dinp one element off; whole outputs.
    const std::string what = std::string(rms ? "rmsnorm" : "layernorm");
    for (bool offset : {true, false}) {
      const Shape rows{s.N, s.C};
      const Tensor gdx = offset ? off_by_one(gpu, dx0, rows, dt()) : gpu.upload(dx0, rows, dt());
      const Tensor gdy = offset ? off_by_one(gpu, dy, rows, dt()) : gpu.upload(dy, rows, dt());
      const Tensor gx = offset ? off_by_one(gpu, x, rows, dt()) : gpu.upload(x, rows, dt());
      const Tensor gdw = gpu.upload(dw0, {s.C}, DType::F32);
      const Tensor gdb = gpu.upload(db0, {s.C}, DType::F32);
      if (rms)
        k::rmsnorm_backward(gdx, gdw, gdy, gx, gw, grstd);
      else
        k::layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, gmean, grstd);
      const std::string how = what + (offset ? " offset" : " aligned");
      expect_close(how + " dinp", gdx, dx, dt());
      expect_close(how + " dweight", gdw, dw, dt());
      if (!rms) expect_close(how + " dbias", gdb, db, dt());
      if (offset) continue;
      // Again from the same start: bitwise the same.
      const Tensor again_dx = gpu.upload(dx0, rows, dt());
      const Tensor again_dw = gpu.upload(dw0, {s.C}, DType::F32);
      const Tensor again_db = gpu.upload(db0, {s.C}, DType::F32);
      if (rms)
        k::rmsnorm_backward(again_dx, again_dw, gdy, gx, gw, grstd);
      else
        k::layernorm_backward(again_dx, again_dw, again_db, gdy, gx, gw, gmean, grstd);
      EXPECT_TRUE(bitwise_equal(download(again_dx), download(gdx))) << what << " dinp varies";
      EXPECT_TRUE(bitwise_equal(download(again_dw), download(gdw))) << what << " dweight varies";
      EXPECT_TRUE(bitwise_equal(download(again_db), download(gdb))) << what << " dbias varies";
      // dinp alone (parameter gradients absent), then the parameter gradients alone.
      const Tensor only_dx = gpu.upload(dx0, rows, dt());
      if (rms)
        k::rmsnorm_backward(only_dx, Tensor{}, gdy, gx, gw, grstd);
      else
        k::layernorm_backward(only_dx, Tensor{}, Tensor{}, gdy, gx, gw, gmean, grstd);
      EXPECT_TRUE(bitwise_equal(download(only_dx), download(gdx))) << what << " dinp alone";
      const Tensor only_dw = gpu.upload(dw0, {s.C}, DType::F32);
      if (rms)
        k::rmsnorm_backward(Tensor{}, only_dw, gdy, gx, gw, grstd);
      else
        k::layernorm_backward(Tensor{}, only_dw, Tensor{}, gdy, gx, gw, gmean, grstd);
      EXPECT_TRUE(bitwise_equal(download(only_dw), download(gdw))) << what << " dweight alone";
    }
  }
}

// ---- cross-entropy ----

// Odd and even vocabularies (50257: every other BF16 row starts off 16 bytes; 50304, GPT-2's
// padded one), fewer classes than one 16-byte access (3 x 5), rows kept in shared memory
// between the passes and rows read twice (crossentropy.cu: kMaxCachedRowBytes; F32 28200 and
// 50257, and 131072 in both types, take the second).
const RowsShape kLogitShapes[] = {{1, 1},      {3, 5},     {7, 1000},   {64, 50257}, {33, 4099},
                                  {17, 50304}, {4, 28200}, {3, 131072}, {2, 9}};

// The CPU reference in double, rounded to float: in float, sums over 131072 classes taken in
// another order differ by 1e-5 of the loss (an H200, 2026-11-29), which is the f32 bound.
void ce_reference(std::vector<float>& losses, std::vector<float>& dlogits,
                  const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t N,
                  int64_t C, float dloss) {
  const std::vector<double> x(logits.begin(), logits.end());
  std::vector<double> l(static_cast<size_t>(N)), d(x.size());
  k::crossentropy_forward_backward(view(l, {N}), view(d, {N, C}), view(x, {N, C}),
                                   view(targets, {N}), dloss);
  losses.assign(l.begin(), l.end());
  dlogits.assign(d.begin(), d.end());
}

TEST_P(CudaKernel, CrossEntropy) {
  for (RowsShape s : kLogitShapes) {
    const auto logits = rand(s.N * s.C, 3.0);
    const auto targets = random_ids(s.N, s.C, 17);
    const float dloss = 1.0f / static_cast<float>(s.N);
    std::vector<float> losses, dlogits;
    ce_reference(losses, dlogits, logits, targets, s.N, s.C, dloss);
    const Tensor glogits = gpu.upload(logits, {s.N, s.C}, dt());
    const Tensor gtargets = gpu.upload_ids(targets, {s.N});
    const Tensor glosses = gpu.poisoned({s.N}, DType::F32);
    const Tensor gdlogits = gpu.poisoned({s.N, s.C}, dt());
    k::crossentropy_forward_backward(glosses, gdlogits, glogits, gtargets, dloss);
    // dlogits in f32: each is exp(x - max) / sum over C terms, summed in another order on
    // each side; over 50257 classes the two differ by 3.5e-5 of the largest (an H200,
    // 2026-11-27), so the f32 bound grows with C (1e-5 up to 4099 classes, as before).
    const double ce_tol = dt() == DType::F32 && s.C > 10000 ? 1e-4 : tolerance(dt());
    expect_close("ce losses " + str(s), glosses, losses, dt());
    expect_close("ce dlogits " + str(s), download(gdlogits), dlogits, ce_tol);
    // Losses only, then the gradient written over the logits.
    const Tensor losses_only = gpu.poisoned({s.N}, DType::F32);
    k::crossentropy_forward_backward(losses_only, Tensor{}, glogits, gtargets, dloss);
    expect_close("ce losses only " + str(s), losses_only, losses, dt());
    k::crossentropy_forward_backward(Tensor{}, glogits, glogits, gtargets, dloss);
    expect_close("ce dlogits in place " + str(s), download(glogits), dlogits, ce_tol);
  }
}

// dlogits whose rows start at another offset from 16 bytes than the logits' (a view one
// element on) take the element-wise gradient; two calls give the same bits.
TEST_P(CudaKernel, CrossEntropyOffsetGradientAndDeterminism) {
  for (RowsShape s : {RowsShape{7, 1000}, RowsShape{5, 50304}, RowsShape{3, 131072}}) {
    const auto logits = rand(s.N * s.C, 3.0);
    const auto targets = random_ids(s.N, s.C, 21);
    const float dloss = 0.5f;
    std::vector<float> losses, dlogits;
    ce_reference(losses, dlogits, logits, targets, s.N, s.C, dloss);
    const Tensor glogits = gpu.upload(logits, {s.N, s.C}, dt());
    const Tensor gtargets = gpu.upload_ids(targets, {s.N});
    const Tensor glosses = gpu.poisoned({s.N}, DType::F32);
    const Tensor gd = poisoned_off_by_one(gpu, {s.N, s.C}, dt());
    k::crossentropy_forward_backward(glosses, gd, glogits, gtargets, dloss);
    const double ce_tol = dt() == DType::F32 && s.C > 10000 ? 1e-4 : tolerance(dt());
    expect_close("ce losses, offset dlogits " + str(s), glosses, losses, dt());
    expect_close("ce offset dlogits " + str(s), download(gd), dlogits, ce_tol);
    const Tensor again_losses = gpu.poisoned({s.N}, DType::F32);
    const Tensor again_d = gpu.poisoned({s.N, s.C}, dt()), first_d = gpu.poisoned({s.N, s.C}, dt());
    k::crossentropy_forward_backward(again_losses, first_d, glogits, gtargets, dloss);
    k::crossentropy_forward_backward(Tensor{}, again_d, glogits, gtargets, dloss);
    EXPECT_TRUE(bitwise_equal(download(again_losses), download(glosses))) << "losses " << str(s);
    EXPECT_TRUE(bitwise_equal(download(again_d), download(first_d))) << "dlogits " << str(s);
  }
}

TEST_P(CudaKernel, VocabParallelCrossEntropy) {
  // Shards [300, 711) of 1000 (411 columns: rows off 16 bytes), and [50000, 100257) of
  // 120000 (a shard as wide as GPT-2's whole vocabulary).
  struct Shard {
    int64_t N, V, start, Vl;
  };
  for (const Shard& c : {Shard{37, 1000, 300, 411}, Shard{6, 120000, 50000, 50257}}) {
    const int64_t N = c.N, V = c.V, start = c.start, Vl = c.Vl;
    const std::string what = " shard " + std::to_string(start) + "+" + std::to_string(Vl);
    const auto logits = rand(N * Vl, 3.0);
    auto targets = random_ids(N, V, 19);  // some inside the shard, most outside
    targets[0] = static_cast<int32_t>(start);
    targets[1] = static_cast<int32_t>(start + Vl - 1);
    const float dloss = 0.25f;
    // The reference in double (sums over 50257 columns in float differ by 5e-5 between orders).
    const std::vector<double> x(logits.begin(), logits.end());
    std::vector<double> max64(N), stats64(2 * N), losses64(N), d64(x.size());
    k::vocab_parallel_ce_max(view(max64, {N}), view(x, {N, Vl}));
    k::vocab_parallel_ce_stats(view(stats64, {2, N}), view(x, {N, Vl}), view(max64, {N}),
                               view(targets, {N}), start);
    k::vocab_parallel_ce_finish(view(losses64, {N}), view(d64, {N, Vl}), view(x, {N, Vl}),
                                view(max64, {N}), view(stats64, {2, N}), view(targets, {N}), start,
                                dloss);
    const std::vector<float> row_max(max64.begin(), max64.end()),
        stats(stats64.begin(), stats64.end()), losses(losses64.begin(), losses64.end()),
        dlogits(d64.begin(), d64.end());
    const Tensor glogits = gpu.upload(logits, {N, Vl}, dt());
    const Tensor gtargets = gpu.upload_ids(targets, {N});
    const Tensor gmax = gpu.poisoned({N}, DType::F32), gstats = gpu.poisoned({2, N}, DType::F32);
    k::vocab_parallel_ce_max(gmax, glogits);
    expect_close("row_max" + what, gmax, row_max, dt());
    k::vocab_parallel_ce_stats(gstats, glogits, gmax, gtargets, start);
    expect_close("stats" + what, gstats, stats, dt());
    // Continue from the reference statistics, so finish is checked on its own.
    const Tensor ref_max = gpu.upload(row_max, {N}, DType::F32);
    const Tensor ref_stats = gpu.upload(stats, {2, N}, DType::F32);
    const Tensor glosses = gpu.poisoned({N}, DType::F32), gd = gpu.poisoned({N, Vl}, dt());
    k::vocab_parallel_ce_finish(glosses, gd, glogits, ref_max, ref_stats, gtargets, start, dloss);
    expect_close("losses" + what, glosses, losses, dt());
    expect_close("dlogits" + what, gd, dlogits, dt());
    const Tensor offset_d = poisoned_off_by_one(gpu, {N, Vl}, dt());
    k::vocab_parallel_ce_finish(Tensor{}, offset_d, glogits, ref_max, ref_stats, gtargets, start,
                                dloss);
    expect_close("offset dlogits" + what, offset_d, dlogits, dt());
    k::vocab_parallel_ce_finish(Tensor{}, glogits, glogits, ref_max, ref_stats, gtargets, start,
                                dloss);
    expect_close("dlogits in place" + what, glogits, dlogits, dt());
  }
}

}  // namespace
}  // namespace pentad::cuda_kernels
