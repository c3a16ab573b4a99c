// The backward in two passes (B: Model::backward_chunk_input, W: backward_chunk_weights) of
// MoE layers (model/split_backward_moe.cpp) against the fused backward_chunk: every
// parameter gradient (router, routed experts, shared experts and the dense layers around
// them), the input gradient and the gradient reports bitwise equal. GPT-2-style and
// SwiGLU experts, with and without shared experts, top 2, with the balancing losses, the
// z-loss, a moved expert bias, sigmoid scores, capacity drops and recompute among the
// configurations; one chunk and a chunk per layer; two micro-batches, in one slot each after
// the other and in two slots in flight at once, B and W interleaved.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "model/model.h"

using namespace pentad;

// Named apart: the unity build compiles this file with the other model tests.
namespace split_backward_moe_test {

constexpr int64_t kB = 2, kT = 16, kVocab = 97;

struct Case {
  std::string name;
  ModelConfig cfg;
};

ModelConfig base(ModelFamily family) {
  ModelConfig cfg;
  cfg.family = family;
  cfg.n_layer = 3;
  cfg.d_model = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = family == ModelFamily::LLaMA ? 2 : 0;
  cfg.vocab_size = kVocab;
  cfg.max_seq_len = kT;
  cfg.tie_embeddings = family == ModelFamily::GPT2;
  cfg.n_experts = 4;
  cfg.top_k = 2;
  cfg.d_ff_expert = 48;
  cfg.moe_layers = "all";
  return cfg;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  ModelConfig gpt2 = base(ModelFamily::GPT2);  // GELU experts with biases, aux and z losses
  gpt2.moe.aux_loss_coef = 0.01f;
  gpt2.moe.z_loss_coef = 0.001f;
  out.push_back({"gpt2 experts", gpt2});
  ModelConfig shared = base(ModelFamily::GPT2);  // a dense layer between, capacity drops
  shared.moe_layers = "0,2";
  shared.n_shared_experts = 1;
  shared.moe.capacity_factor = 1.0f;
  shared.moe.seq_aux_loss_coef = 0.01f;
  out.push_back({"gpt2 shared experts, capacity", shared});
  ModelConfig mixtral = base(ModelFamily::LLaMA);  // SwiGLU experts, softmax, renormalized
  mixtral.moe.aux_loss_coef = 0.01f;
  mixtral.moe.seq_aux_loss_coef = 0.01f;
  mixtral.moe.z_loss_coef = 0.001f;
  out.push_back({"swiglu experts", mixtral});
  ModelConfig deepseek = base(ModelFamily::LLaMA);  // sigmoid scores, a moved selection bias
  deepseek.n_shared_experts = 1;
  deepseek.moe.score = MoeScore::Sigmoid;
  deepseek.moe.bias_update_rate = 0.01f;
  deepseek.moe.aux_loss_coef = 0.01f;
  out.push_back({"swiglu shared experts, sigmoid, bias", deepseek});
  // Recompute: B rebuilds each layer (the routing and routed rows into the slot's
  // MoeBlock::Acts, as the fused backward), W's dense operands kept in the slot.
  shared.recompute = true;
  out.push_back({"gpt2 shared experts, capacity, recompute", shared});
  mixtral.recompute = true;
  out.push_back({"swiglu experts, recompute", mixtral});
  return out;
}

std::vector<LayerRange> layout(const ModelConfig& cfg, bool per_layer) {
  if (!per_layer) return {};
  std::vector<LayerRange> chunks;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    chunks.push_back({l, l + 1, l == 0, l + 1 == cfg.n_layer});
  return chunks;
}

// Every parameter gradient, d(model input) of the last micro-batch, the offsets reported
// final (adjacent repeats, the polls, dropped).
struct Result {
  std::vector<float> grads, input_grad;
  std::vector<int64_t> ready;
  std::vector<std::string> zero;  // the parameters whose gradient is zero throughout
};

// A run's two micro-batches: `forward(model, micro, slot)` runs one forward, `backward` the
// schedule of backwards; d_output holds two (rows, C) buffers, one per slot.
struct Run {
  Model& model;
  Tensor d_output[2];
  GradsReady listen;
};
using Schedule = std::function<void(Run&, const std::function<void(int micro, int slot)>&)>;

Result run(const ModelConfig& cfg, bool per_layer, const Schedule& schedule) {
  Model model(cfg, kB, kT, {}, layout(cfg, per_layer));
  for (int c = 0; c < model.chunks(); ++c) model.add_slot(c);  // slot 1, for two in flight
  model.params().initialize(3);
  model.params().zero_grads();
  if (cfg.moe.bias_update_rate > 0) {  // a selection bias that is not zero
    std::vector<double> counts;
    for (int64_t l = 0; l < cfg.n_layer; ++l)
      for (int64_t e = 0; e < cfg.n_experts; ++e) counts.push_back(double((l + 3 * e) % 5));
    model.update_expert_bias(counts);
  }
  Arena arena("d_output", 2 * size_t(kB * kT * cfg.d_model) * sizeof(float) + 512);
  Result r;
  Run run{model,
          {arena.alloc(Shape{kB * kT, cfg.d_model}), arena.alloc(Shape{kB * kT, cfg.d_model})},
          [&](int64_t offset) {
            if (r.ready.empty() || r.ready.back() != offset) r.ready.push_back(offset);
          }};
  auto forward = [&](int micro, int slot) {
    std::vector<int32_t> in(size_t(kB * kT)), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>(splitmix64(i + 100 * uint64_t(micro)) % kVocab);
      tg[i] = static_cast<int32_t>(splitmix64(i + 1000 + 100 * uint64_t(micro)) % kVocab);
    }
    for (int c = 0; c < model.chunks(); ++c) {
      if (c > 0) copy(model.chunk_input(c, slot), model.chunk_output(c - 1, slot));
      model.forward_chunk(c, slot, c == 0 ? in.data() : nullptr,
                          c + 1 == model.chunks() ? tg.data() : nullptr, 1.0f / float(kB * kT));
    }
  };
  schedule(run, forward);
  const Tensor g = model.params().all_grads();
  r.grads.assign(g.f32(), g.f32() + g.numel());
  for (const ParamSpec& spec : model.params().specs()) {
    const auto first = r.grads.begin() + int64_t(spec.offset);
    if (std::all_of(first, first + spec.local_shape.numel(), [](float x) { return x == 0; }))
      r.zero.push_back(spec.name);
  }
  const Tensor d = model.input_grad();
  r.input_grad.assign(d.f32(), d.f32() + d.numel());
  return r;
}

// B of chunk c, slot s, from (top chunk) the loss or d_output[s]; d(chunk input) into it.
void b_pass(Run& r, int c, int s) {
  r.model.backward_chunk_input(c, s, r.d_output[s]);
  copy(r.d_output[s], r.model.input_grad());
}
void w_pass(Run& r, int c, int s, bool last) {
  r.model.backward_chunk_weights(c, s, last, r.listen);
}

// The reference: each micro-batch's forward, then its fused backward.
void fused(Run& r, const std::function<void(int, int)>& forward) {
  for (int micro = 0; micro < 2; ++micro) {
    forward(micro, 0);
    for (int c = r.model.chunks() - 1; c >= 0; --c) {
      r.model.backward_chunk(c, 0, r.d_output[0], micro == 1, r.listen);
      copy(r.d_output[0], r.model.input_grad());
    }
  }
}

// Each micro-batch in slot 0: every B from the top, then every W from the top.
void every_b_then_every_w(Run& r, const std::function<void(int, int)>& forward) {
  for (int micro = 0; micro < 2; ++micro) {
    forward(micro, 0);
    for (int c = r.model.chunks() - 1; c >= 0; --c) b_pass(r, c, 0);
    for (int c = r.model.chunks() - 1; c >= 0; --c) w_pass(r, c, 0, micro == 1);
  }
}

// Each micro-batch in slot 0: B(top), then B(c) W(c + 1) down the chunks, then W(0).
void interleaved(Run& r, const std::function<void(int, int)>& forward) {
  for (int micro = 0; micro < 2; ++micro) {
    forward(micro, 0);
    const int top = r.model.chunks() - 1;
    b_pass(r, top, 0);
    for (int c = top - 1; c >= 0; --c) {
      b_pass(r, c, 0);
      w_pass(r, c + 1, 0, micro == 1);
    }
    w_pass(r, 0, 0, micro == 1);
  }
}

// two_slots' reference: both forwards, then each slot's fused backward. (A tied head adds its
// gradient in the forward, so with both forwards first wte's gradient sums in another order
// than fused()'s.)
void fused_two_slots(Run& r, const std::function<void(int, int)>& forward) {
  forward(0, 0);
  forward(1, 1);
  for (int s = 0; s < 2; ++s)
    for (int c = r.model.chunks() - 1; c >= 0; --c) {
      r.model.backward_chunk(c, s, r.d_output[s], s == 1, r.listen);
      copy(r.d_output[s], r.model.input_grad());
    }
}

// Both micro-batches in flight (slots 0 and 1): both forwards, then per chunk B(slot 0) and
// B(slot 1), then slot 0's every W and slot 1's. Slot 1's B runs the MoE blocks' backward
// scratch over between slot 0's B and its W.
void two_slots(Run& r, const std::function<void(int, int)>& forward) {
  forward(0, 0);
  forward(1, 1);
  for (int c = r.model.chunks() - 1; c >= 0; --c) {
    b_pass(r, c, 0);
    b_pass(r, c, 1);
  }
  for (int s = 0; s < 2; ++s)
    for (int c = r.model.chunks() - 1; c >= 0; --c) w_pass(r, c, s, s == 1);
}

void expect_bitwise(const Result& want, const Result& got, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(want.grads.size(), got.grads.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.grads.size(); ++i)
    differ += std::memcmp(&want.grads[i], &got.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << want.grads.size() << " gradient values";
  ASSERT_EQ(want.input_grad.size(), got.input_grad.size());
  EXPECT_EQ(0, std::memcmp(want.input_grad.data(), got.input_grad.data(),
                           want.input_grad.size() * sizeof(float)));
  EXPECT_EQ(want.ready, got.ready);
}

class SplitBackwardMoe : public ::testing::TestWithParam<size_t> {};

TEST_P(SplitBackwardMoe, EqualsTheFusedBackwardBitwise) {
  omp_set_num_threads(2);
  const Case c = cases()[GetParam()];
  SCOPED_TRACE(c.name);
  for (bool per_layer : {false, true}) {
    const Result want = run(c.cfg, per_layer, fused);
    // Every parameter's gradient is reached (some value not zero), but the expert biases'
    // (moved by counts, never by gradients): every router and routed expert took part.
    for (const std::string& name : want.zero)
      EXPECT_NE(name.find("expert_bias"), std::string::npos) << name << ": gradient zero";
    EXPECT_EQ(want.ready.back(), 0);
    const std::string layout_name = per_layer ? "a chunk per layer" : "one chunk";
    expect_bitwise(want, run(c.cfg, per_layer, every_b_then_every_w),
                   layout_name + ": every B, then every W");
    expect_bitwise(want, run(c.cfg, per_layer, interleaved), layout_name + ": B(c) W(c+1)");
    expect_bitwise(run(c.cfg, per_layer, fused_two_slots), run(c.cfg, per_layer, two_slots),
                   layout_name + ": two slots in flight");
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  static const char* const names[] = {"Gpt2Experts",         "Gpt2SharedCapacity",
                                      "SwigluExperts",       "SwigluSharedSigmoidBias",
                                      "Gpt2SharedRecompute", "SwigluRecompute"};
  return names[info.param];
}

INSTANTIATE_TEST_SUITE_P(Configs, SplitBackwardMoe, ::testing::Values(0, 1, 2, 3, 4, 5), case_name);

// B keeps the routed experts' output gradients and d(logits) per slot and MoE layer (in
// the slot's MoeBlock::Acts, as declare_moe_deferred declares them, counted by
// deferred_bytes()); d(att_out) over res1 and d(chunk input) over the embedding's output
// (declare_deferred_layer and _ends: nothing declared without sequence parallelism, and no
// MLP buffers without shared experts); the fused backward keeps none. A slot waiting for its
// W refuses a forward and another B.
TEST(SplitBackwardMoeSlots, KeepTheirGradientsUntilW) {
  omp_set_num_threads(2);
  std::vector<int32_t> ids(size_t(kB * kT));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(splitmix64(i) % kVocab);
  const ModelConfig cfg = base(ModelFamily::LLaMA);
  Model moe(cfg, kB, kT);
  moe.params().initialize(3);
  moe.forward(ids.data(), ids.data(), 1.0f);
  moe.backward();
  EXPECT_EQ(moe.deferred_bytes(), 0u);
  moe.forward(ids.data(), ids.data(), 1.0f);
  moe.backward_chunk_input(0, 0, Tensor{});
  // What the declarations add up to: on one device, dropless, each layer receives all of its
  // N k picks (R = N k).
  const ActSizes sizes = activation_sizes(cfg, kB, kT, 1, 1, false, DType::F32);
  const double N = double(kB * kT), E = double(cfg.n_experts), k = double(cfg.top_k);
  MoeBlock::Acts acts;
  DeferredGrads layer;
  Tensor d_input;
  const double routed = bytes_of([&](ActSink& sink) {
    declare_moe_deferred(N, E, N * k, double(cfg.d_model), double(cfg.d_ff_expert), DType::F32,
                         false, sink, acts);
  });
  const double rest = bytes_of([&](ActSink& sink) {
    for (int64_t l = 0; l < cfg.n_layer; ++l)
      declare_deferred_layer(sizes, 0, true, Tensor{}, Tensor{}, sink, layer);
    declare_deferred_ends(sizes, true, Tensor{}, sink, d_input);
  });
  EXPECT_EQ(rest, 0.0);
  EXPECT_EQ(routed, 4 * (N * E + N * k * (cfg.d_model + 2 * cfg.d_ff_expert)));
  // The arenas round each buffer up and the MoE ones grow half again at once.
  const double kept = double(moe.deferred_bytes()), layers = double(cfg.n_layer);
  EXPECT_GE(kept, rest + layers * routed);
  EXPECT_LE(kept, rest + layers * 1.5 * routed + 16 * 1024);
  EXPECT_THROW(moe.forward(ids.data(), ids.data(), 1.0f), std::exception);
  EXPECT_THROW(moe.backward_chunk_input(0, 0, Tensor{}), std::exception);
  moe.backward_chunk_weights(0, 0, true);
  moe.forward(ids.data(), ids.data(), 1.0f);  // the slot is free again
  moe.backward_chunk_input(0, 0, Tensor{});
  moe.backward_chunk_weights(0, 0, true);
}

}  // namespace split_backward_moe_test
