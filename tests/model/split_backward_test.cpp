// The backward in two passes (Model::backward_chunk_input, B, then backward_chunk_weights,
// W; model/split_backward.cpp) against the fused backward_chunk: every parameter gradient,
// the input gradient and the gradient reports bitwise equal, in any order of B and W that
// keeps each slot's W after its B.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "model/model.h"

using namespace pentad;

// Named apart: the unity build compiles this file with the other model tests.
namespace split_backward_test {

ModelConfig tiny(ModelFamily family) {
  ModelConfig cfg;
  cfg.family = family;
  cfg.n_layer = 3;
  cfg.d_model = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = family == ModelFamily::LLaMA ? 2 : 0;
  cfg.vocab_size = 97;
  cfg.max_seq_len = 16;
  cfg.tie_embeddings = family == ModelFamily::GPT2;
  return cfg;
}

constexpr int64_t kB = 2, kT = 16;

// One chunk of all layers, or one chunk per layer (as a rank holding several pipeline chunks).
std::vector<LayerRange> layout(const ModelConfig& cfg, bool per_layer) {
  if (!per_layer) return {};
  std::vector<LayerRange> chunks;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    chunks.push_back({l, l + 1, l == 0, l + 1 == cfg.n_layer});
  return chunks;
}

// What a backward leaves: every parameter gradient, d(model input), and the offsets reported
// final (adjacent repeats, the polls, dropped: the two passes poll at different places).
struct Result {
  std::vector<float> grads, input_grad;
  std::vector<int64_t> ready;
};

// How the chunks' backward runs, from the top chunk down: the model, the d_output buffer to
// pass between chunks, last_micro_batch and the listener.
using Backward = std::function<void(Model&, Tensor, bool, const GradsReady&)>;

// Two micro-batches (the second's gradients added to the first's), each forward then
// `backward` over every chunk.
Result run(const ModelConfig& cfg, bool per_layer, const Backward& backward,
           bool each_pass = false) {
  Model model(cfg, kB, kT, {}, layout(cfg, per_layer));
  model.params().initialize(3);
  model.set_reduce_each_pass(each_pass);
  model.params().zero_grads();
  Arena arena("d_output", size_t(kB * kT * cfg.d_model) * sizeof(float) + 256);
  const Tensor d_output = arena.alloc(Shape{kB * kT, cfg.d_model});
  Result r;
  const GradsReady listen = [&](int64_t offset) {
    if (r.ready.empty() || r.ready.back() != offset) r.ready.push_back(offset);
  };
  for (uint64_t micro = 0; micro < 2; ++micro) {
    std::vector<int32_t> in(size_t(kB * kT)), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>(splitmix64(i + 100 * micro) % 97);
      tg[i] = static_cast<int32_t>(splitmix64(i + 1000 + 100 * micro) % 97);
    }
    for (int c = 0; c < model.chunks(); ++c) {
      if (c > 0) copy(model.chunk_input(c, 0), model.chunk_output(c - 1, 0));
      model.forward_chunk(c, 0, c == 0 ? in.data() : nullptr,
                          c + 1 == model.chunks() ? tg.data() : nullptr, 1.0f / float(kB * kT));
    }
    backward(model, d_output, micro == 1, listen);
  }
  const Tensor g = model.params().all_grads();
  r.grads.assign(g.f32(), g.f32() + g.numel());
  const Tensor d = model.input_grad();
  r.input_grad.assign(d.f32(), d.f32() + d.numel());
  return r;
}

// d(chunk c's input) into d_output, for the chunk below.
void pass_down(Model& model, Tensor d_output) {
  copy(d_output, model.input_grad());
}

void fused(Model& model, Tensor d, bool last, const GradsReady& on_ready) {
  for (int c = model.chunks() - 1; c >= 0; --c) {
    model.backward_chunk(c, 0, d, last, on_ready);
    pass_down(model, d);
  }
}

// B of every chunk from the top, then W of every chunk from the top.
void every_b_then_every_w(Model& model, Tensor d, bool last, const GradsReady& on_ready) {
  for (int c = model.chunks() - 1; c >= 0; --c) {
    model.backward_chunk_input(c, 0, d);
    pass_down(model, d);
  }
  for (int c = model.chunks() - 1; c >= 0; --c) model.backward_chunk_weights(c, 0, last, on_ready);
}

// B(top), then B(c) W(c + 1) down the chunks, then W(0).
void interleaved(Model& model, Tensor d, bool last, const GradsReady& on_ready) {
  const int top = model.chunks() - 1;
  model.backward_chunk_input(top, 0, d);
  pass_down(model, d);
  for (int c = top - 1; c >= 0; --c) {
    model.backward_chunk_input(c, 0, d);
    pass_down(model, d);
    model.backward_chunk_weights(c + 1, 0, last, on_ready);
  }
  model.backward_chunk_weights(0, 0, last, on_ready);
}

void expect_bitwise(const Result& want, const Result& got, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(want.grads.size(), got.grads.size());
  EXPECT_EQ(0, std::memcmp(want.grads.data(), got.grads.data(), want.grads.size() * sizeof(float)));
  ASSERT_EQ(want.input_grad.size(), got.input_grad.size());
  EXPECT_EQ(0, std::memcmp(want.input_grad.data(), got.input_grad.data(),
                           want.input_grad.size() * sizeof(float)));
  EXPECT_EQ(want.ready, got.ready);
}

class SplitBackward : public ::testing::TestWithParam<ModelFamily> {};

// With and without model.recompute (B rebuilds each layer's activations, keeping W's
// operands in the slot; the fused backward rebuilds them in the scratch).
TEST_P(SplitBackward, EqualsTheFusedBackwardBitwise) {
  omp_set_num_threads(2);
  ModelConfig cfg = tiny(GetParam());
  for (const auto& [recompute, per_layer] :
       {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
    cfg.recompute = recompute;
    const Result want = run(cfg, per_layer, fused);
    // The gradients are not trivially zero, and every parameter's is reached.
    double norm = 0;
    for (float x : want.grads) norm += double(x) * x;
    EXPECT_GT(norm, 0.0);
    EXPECT_EQ(want.ready.back(), 0);  // the embedding's, the arena's start, last
    const std::string layout_name = std::string(per_layer ? "a chunk per layer" : "one chunk") +
                                    (recompute ? ", recompute" : "");
    expect_bitwise(want, run(cfg, per_layer, every_b_then_every_w),
                   layout_name + ": every B, then every W");
    expect_bitwise(want, run(cfg, per_layer, interleaved), layout_name + ": B(c) W(c+1)");
  }
}

// Without sequence parallelism B keeps its output gradients over activations only B reads
// (declare_deferred_layer): the split holds no memory beyond the fused backward's. A slot
// waiting for its W refuses a forward and another B; W without B is refused.
TEST_P(SplitBackward, KeepsItsGradientsUntilW) {
  omp_set_num_threads(2);
  const ModelConfig cfg = tiny(GetParam());
  Model model(cfg, kB, kT);
  model.params().initialize(3);
  const size_t fused_bytes = model.activation_bytes();
  const double declared = model.declared_activation_bytes();
  std::vector<int32_t> ids(size_t(kB * kT), 5);
  model.forward(ids.data(), ids.data(), 1.0f);
  model.backward();
  EXPECT_EQ(model.deferred_bytes(), 0u);
  EXPECT_EQ(model.activation_bytes(), fused_bytes);
  EXPECT_THROW(model.backward_chunk_weights(0, 0, true), std::exception);
  model.forward(ids.data(), ids.data(), 1.0f);
  model.backward_chunk_input(0, 0, Tensor{});
  EXPECT_EQ(model.deferred_bytes(), 0u);
  EXPECT_EQ(model.activation_bytes(), fused_bytes);
  EXPECT_EQ(model.declared_activation_bytes(), declared);
  EXPECT_THROW(model.forward(ids.data(), ids.data(), 1.0f), std::exception);
  EXPECT_THROW(model.backward_chunk_input(0, 0, Tensor{}), std::exception);
  model.backward_chunk_weights(0, 0, true);
  model.forward(ids.data(), ids.data(), 1.0f);  // the slot is free again
  model.backward_chunk_input(0, 0, Tensor{});
  model.backward_chunk_weights(0, 0, true);
}

// ZeRO-2 under pipelining (Model::set_reduce_each_pass): B adds the norms' gradients into
// buffers of the model's own, so every B leaves the arena's gradients as they were (ZeRO-2's
// buckets stay unbacked until W); W joins them, and the step's gradients are the fused
// backward's (the norms' summed in another order: not bitwise).
TEST_P(SplitBackward, ReducingEachPassLeavesTheArenaAloneUntilW) {
  omp_set_num_threads(2);
  const ModelConfig cfg = tiny(GetParam());
  const Result want = run(cfg, true, fused);
  int bs = 0;
  const Backward checked = [&](Model& model, Tensor d, bool last, const GradsReady& on_ready) {
    const Tensor g = model.params().all_grads();
    const std::vector<float> before(g.f32(), g.f32() + g.numel());
    for (int c = model.chunks() - 1; c >= 0; --c) {
      model.backward_chunk_input(c, 0, d);
      pass_down(model, d);
      ++bs;
      ASSERT_EQ(0, std::memcmp(before.data(), g.f32(), before.size() * sizeof(float)))
          << "B of chunk " << c << " wrote a parameter gradient";
    }
    for (int c = model.chunks() - 1; c >= 0; --c)
      model.backward_chunk_weights(c, 0, last, on_ready);
  };
  const Result got = run(cfg, true, checked, /*each_pass=*/true);
  EXPECT_GT(bs, 2);
  ASSERT_EQ(want.grads.size(), got.grads.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    worst = std::max(worst, std::abs(double(want.grads[i]) - got.grads[i]));
    scale = std::max(scale, std::abs(double(want.grads[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale);
}

INSTANTIATE_TEST_SUITE_P(Families, SplitBackward,
                         ::testing::Values(ModelFamily::GPT2, ModelFamily::LLaMA));

// Under recompute the slot keeps no LayerActs; B's arena holds, per layer, d(att_out) (res1
// is the scratch's) and W's operands (declare_deferred_layer), as declared; d(out) and
// d(chunk input) go over the residual streams. The fused backward's memory unchanged, the
// split's that much more.
TEST(SplitBackwardRecompute, KeepsWsOperandsPerSlot) {
  omp_set_num_threads(2);
  std::vector<int32_t> ids(size_t(kB * kT), 5);
  ModelConfig cfg = tiny(ModelFamily::LLaMA);
  cfg.recompute = true;
  Model model(cfg, kB, kT);
  model.params().initialize(3);
  const size_t fused_bytes = model.activation_bytes();
  const double declared = model.declared_activation_bytes();
  model.forward(ids.data(), ids.data(), 1.0f);
  model.backward_chunk_input(0, 0, Tensor{});
  const ActSizes sizes = activation_sizes(cfg, kB, kT, 1, 1, false, DType::F32);
  DeferredGrads layer;
  Tensor d_input;
  const double kept = bytes_of([&](ActSink& sink) {
    for (int64_t l = 0; l < cfg.n_layer; ++l)
      declare_deferred_layer(sizes, double(ffn_dim(cfg)), false, Tensor{}, Tensor{}, sink, layer);
    declare_deferred_ends(sizes, true, Tensor{}, sink, d_input);
  });
  // d(att_out) (C), norm1, norm2 (C each), q, att (C each), k, v (C / 2 each: 2 of 4
  // heads), up, gate, act (the MLP width each) a row a layer.
  const double N = double(kB * kT), C = double(cfg.d_model), F = double(ffn_dim(cfg));
  EXPECT_EQ(kept, 4 * N * double(cfg.n_layer) * (6 * C + 3 * F));
  EXPECT_EQ(model.declared_activation_bytes(), declared + kept);
  EXPECT_GE(double(model.deferred_bytes()), kept);
  EXPECT_LE(double(model.deferred_bytes()), kept + 64.0 * 64);  // each buffer aligned
  EXPECT_EQ(model.activation_bytes(), fused_bytes + model.deferred_bytes());
  model.backward_chunk_weights(0, 0, true);
}

// zb-v's first stage holds a tied embedding's two uses in two chunks, and its lists may run
// one micro-batch's embedding W after the next one's head W. With the head's share kept
// apart (set_tied_head_apart) wte's gradient is bitwise the same in either order, and the
// fused backward's to rounding.
std::vector<float> tied_grads(bool apart, bool embedding_late) {
  const ModelConfig cfg = tiny(ModelFamily::GPT2);  // tied
  Model model(cfg, kB, kT, {}, layout(cfg, true));
  model.set_tied_head_apart(apart);
  model.params().initialize(3);
  model.params().zero_grads();
  const int top = model.chunks() - 1;
  for (int c = 0; c <= top; ++c) model.add_slot(c);
  Arena arena("d_output", size_t(kB * kT * cfg.d_model) * sizeof(float) + 256);
  const Tensor d = arena.alloc(Shape{kB * kT, cfg.d_model});
  std::vector<std::vector<int32_t>> ids(2, std::vector<int32_t>(size_t(kB * kT)));
  for (int micro = 0; micro < 2; ++micro) {
    for (size_t i = 0; i < ids[0].size(); ++i)
      ids[size_t(micro)][i] = static_cast<int32_t>(splitmix64(i + 100 * uint64_t(micro)) % 97);
    for (int c = 0; c <= top; ++c) {
      if (c > 0) copy(model.chunk_input(c, micro), model.chunk_output(c - 1, micro));
      model.forward_chunk(c, micro, ids[size_t(micro)].data(), ids[size_t(micro)].data(),
                          1.0f / float(kB * kT));
    }
    for (int c = top; c >= 0; --c) {
      model.backward_chunk_input(c, micro, d);
      copy(d, model.input_grad());
    }
    for (int c = top; c >= (embedding_late ? 1 : 0); --c)
      model.backward_chunk_weights(c, micro, micro == 1);
    if (!embedding_late) continue;
    if (micro == 1) model.backward_chunk_weights(0, 0, false);  // micro-batch 0's, late
    if (micro == 1) model.backward_chunk_weights(0, 1, true);
  }
  const Tensor g = model.params().all_grads();
  return std::vector<float>(g.f32(), g.f32() + g.numel());
}

TEST(SplitBackwardTied, HeadApartSumsInOneOrder) {
  omp_set_num_threads(2);
  const std::vector<float> in_order = tied_grads(true, false), late = tied_grads(true, true);
  ASSERT_EQ(in_order.size(), late.size());
  EXPECT_EQ(0, std::memcmp(in_order.data(), late.data(), late.size() * sizeof(float)));
  const std::vector<float> fused = tied_grads(false, false);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < fused.size(); ++i) {
    diff += double(fused[i] - late[i]) * double(fused[i] - late[i]);
    norm += double(fused[i]) * fused[i];
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 1e-6);
}

}  // namespace split_backward_test
