// The backward in two passes (Model::backward_chunk_input, B, then backward_chunk_weights,
// W; model/split_backward.cpp, split_backward_tp.cpp) under tensor and context parallelism,
// on 4 ranks: 1D tp with and without sequence parallelism, 2D tp (2 x 2, two row pieces)
// with and without it, cp 2 as ring and as Ulysses, and cp with tp, two of them with
// recompute. Against the fused backward_chunk at the same layout, on every rank: every
// parameter gradient, the input gradient and the gradient reports bitwise equal, for B and W
// in several orders over two micro-batches, with one chunk of every layer and with a chunk
// per layer.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "launch/rank.h"
#include "parallel/mesh.h"
#include "plan/layout.h"
#include "recipe/recipe.h"
#include "tests/parallel/mpi_test_util.h"
#include "train/parallelize.h"

using namespace pentad;

namespace {

using mpi_test::world_size;

// One layout of the ranks: its name, recipe keys and the ranks it needs (tp x cp; the rest
// of the world is data parallel, which this test leaves alone).
struct Layout {
  const char* name;
  std::vector<std::string> keys;
  int ranks;
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp 2", {"parallel.tp=2"}, 2},
      {"tp 2 + sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}, 2},
      {"tp 2x2", {"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.tp_chunks=2"}, 4},
      {"tp 2x2 + sp",
       {"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.tp_chunks=2",
        "parallel.sequence_parallel=true"},
       4},
      {"cp 2 ring", {"parallel.cp=2", "parallel.cp_impl=\"ring\""}, 2},
      {"cp 2 ulysses", {"parallel.cp=2", "parallel.cp_impl=\"ulysses\""}, 2},
      {"cp 2 ring x tp 2 + sp",
       {"parallel.cp=2", "parallel.cp_impl=\"ring\"", "parallel.tp=2",
        "parallel.sequence_parallel=true"},
       4},
      {"cp 2 ulysses x tp 2",
       {"parallel.cp=2", "parallel.cp_impl=\"ulysses\"", "parallel.tp=2"},
       4},
      // Recompute: B rebuilds each layer (its collectives again, as the fused backward's).
      {"tp 2x2 + sp, recompute",
       {"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.tp_chunks=2",
        "parallel.sequence_parallel=true", "model.recompute=true"},
       4},
      {"cp 2 ring x tp 2 + sp, recompute",
       {"parallel.cp=2", "parallel.cp_impl=\"ring\"", "parallel.tp=2",
        "parallel.sequence_parallel=true", "model.recompute=true"},
       4},
  };
  return all;
}

Config recipe(const std::string& family, const Layout& layout) {
  std::vector<std::string> keys = {
      "model.family=" + family, "model.n_layer=3",     "model.d_model=32",     "model.n_head=4",
      "model.d_ff=64",          "model.vocab_size=96", "model.max_seq_len=16", "train.seq_len=16",
      "train.micro_batch=2",    "train.threads=1",     "data.source=random"};
  if (family == "llama") keys.push_back("model.n_kv_head=2");
  keys.insert(keys.end(), layout.keys.begin(), layout.keys.end());
  return parse_recipe("", "split-backward-tp-test", keys);
}

// One chunk of all layers, or one chunk per layer (as a rank holding several pipeline chunks).
std::vector<LayerRange> chunk_layout(const ModelConfig& cfg, bool per_layer) {
  if (!per_layer) return {};
  std::vector<LayerRange> chunks;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    chunks.push_back({l, l + 1, l == 0, l + 1 == cfg.n_layer});
  return chunks;
}

// What a backward leaves on this rank: every parameter gradient, d(model input) (this
// rank's rows), and the offsets reported final (adjacent repeats, the polls, dropped).
struct Result {
  std::vector<float> grads, input_grad;
  std::vector<int64_t> ready;
};

// How the two micro-batches' backward runs. Fused: backward_chunk. EveryBThenEveryW: per
// micro-batch B of every chunk from the top, then W of every chunk. Interleaved: B(top), then
// B(c) W(c + 1) down the chunks, then W(0). TwoInFlight: both micro-batches forward in two
// slots, micro-batch 0's B, then B(c) of 1 with W(c) of 0 down the chunks, then 1's W.
// FusedTwoInFlight, its reference: both forwards, then each one's fused backward (a tied
// head adds its gradient in the forward: wte's then sums in another order than Fused's).
enum class Order { Fused, EveryBThenEveryW, Interleaved, TwoInFlight, FusedTwoInFlight };

class Runner {
 public:
  Runner(const Config& cfg, const Sharding& sharding, bool per_layer)
      : cfg_(cfg),
        t_(cfg.train.seq_len / (sharding.cp ? sharding.cp->degree() : 1)),
        model_(cfg.model, cfg.train.micro_batch, t_, sharding, chunk_layout(cfg.model, per_layer)),
        arena_("d_output", size_t(model_.rows() * cfg.model.d_model) * sizeof(float) + 256),
        d_(arena_.alloc(Shape{model_.rows(), cfg.model.d_model})) {
    model_.params().initialize(3);
    model_.params().zero_grads();
    listen_ = [this](int64_t offset) {
      if (r_.ready.empty() || r_.ready.back() != offset) r_.ready.push_back(offset);
    };
  }

  Result run(Order order) {
    const int top = model_.chunks() - 1;
    if (order == Order::TwoInFlight || order == Order::FusedTwoInFlight) {
      for (int c = 0; c <= top; ++c) model_.add_slot(c);
      forward(0, 0);
      forward(1, 1);
      if (order == Order::FusedTwoInFlight) {
        for (int s = 0; s < 2; ++s)
          for (int c = top; c >= 0; --c) {
            model_.backward_chunk(c, s, d_, s == 1, listen_);
            copy(d_, model_.input_grad());
          }
        return result();
      }
      for (int c = top; c >= 0; --c) input(c, 0);
      for (int c = top; c >= 0; --c) {
        input(c, 1);
        model_.backward_chunk_weights(c, 0, false, listen_);
      }
      for (int c = top; c >= 0; --c) model_.backward_chunk_weights(c, 1, true, listen_);
      return result();
    }
    for (int micro = 0; micro < 2; ++micro) {
      forward(micro, 0);
      const bool last = micro == 1;
      if (order == Order::Fused) {
        for (int c = top; c >= 0; --c) {
          model_.backward_chunk(c, 0, d_, last, listen_);
          copy(d_, model_.input_grad());
        }
      } else if (order == Order::EveryBThenEveryW) {
        for (int c = top; c >= 0; --c) input(c, 0);
        for (int c = top; c >= 0; --c) model_.backward_chunk_weights(c, 0, last, listen_);
      } else {
        input(top, 0);
        for (int c = top - 1; c >= 0; --c) {
          input(c, 0);
          model_.backward_chunk_weights(c + 1, 0, last, listen_);
        }
        model_.backward_chunk_weights(0, 0, last, listen_);
      }
    }
    return result();
  }

 private:
  // Micro-batch `micro` through every chunk in `slot`; the same ids on every rank.
  void forward(int micro, int slot) {
    const size_t n = size_t(cfg_.train.micro_batch * t_);
    std::vector<int32_t> in(n), tg(n);
    for (size_t i = 0; i < n; ++i) {
      in[i] = static_cast<int32_t>(splitmix64(i + 100 * uint64_t(micro)) % 96);
      tg[i] = static_cast<int32_t>(splitmix64(i + 1000 + 100 * uint64_t(micro)) % 96);
    }
    for (int c = 0; c < model_.chunks(); ++c) {
      if (c > 0) copy(model_.chunk_input(c, slot), model_.chunk_output(c - 1, slot));
      model_.forward_chunk(c, slot, c == 0 ? in.data() : nullptr,
                           c + 1 == model_.chunks() ? tg.data() : nullptr, 1.0f / float(n * 4));
    }
  }
  // B of chunk c, its input gradient passed down for the chunk below.
  void input(int c, int slot) {
    model_.backward_chunk_input(c, slot, d_);
    copy(d_, model_.input_grad());
  }
  Result result() {
    const Tensor g = model_.params().all_grads();
    r_.grads.assign(g.f32(), g.f32() + g.numel());
    const Tensor d = model_.input_grad();
    r_.input_grad.assign(d.f32(), d.f32() + d.numel());
    return r_;
  }

  const Config& cfg_;
  int64_t t_;
  Model model_;
  Arena arena_;
  Tensor d_;
  Result r_;
  GradsReady listen_;
};

void expect_bitwise(const Result& want, const Result& got, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(want.grads.size(), got.grads.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.grads.size(); ++i)
    differ += std::memcmp(&want.grads[i], &got.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "parameter gradient values differ of " << want.grads.size();
  ASSERT_EQ(want.input_grad.size(), got.input_grad.size());
  EXPECT_EQ(0, std::memcmp(want.input_grad.data(), got.input_grad.data(),
                           want.input_grad.size() * sizeof(float)));
  EXPECT_EQ(want.ready, got.ready);
}

class SplitBackwardParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitBackwardParallel, EqualsTheFusedBackwardBitwise) {
  const int world = world_size();
  int ran = 0;
  for (const Layout& layout : layouts()) {
    if (world % layout.ranks != 0) continue;
    const Config cfg = recipe(GetParam(), layout);
    launch::start_rank(cfg);  // threads, as the executable sets them
    parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, world), MPI_COMM_WORLD);
    ModelWiring wiring;
    parallelize(cfg, &mesh, Placement{}, wiring);  // the hooks; the model is built below
    const Sharding sharding{wiring.tp.get(), wiring.ep.get(), wiring.cp.get()};
    ASSERT_EQ((sharding.tp ? sharding.tp->degree() : 1) * (sharding.cp ? sharding.cp->degree() : 1),
              layout.ranks)
        << layout.name;
    ++ran;
    for (bool per_layer : {false, true}) {
      const std::string name =
          std::string(layout.name) + (per_layer ? ", a chunk per layer" : ", one chunk");
      const Result want = Runner(cfg, sharding, per_layer).run(Order::Fused);
      double norm = 0;  // the gradients are not trivially zero
      for (float x : want.grads) norm += double(x) * x;
      EXPECT_GT(norm, 0.0) << name;
      EXPECT_FALSE(want.ready.empty()) << name;
      expect_bitwise(want, Runner(cfg, sharding, per_layer).run(Order::EveryBThenEveryW),
                     name + ": every B, then every W");
      expect_bitwise(want, Runner(cfg, sharding, per_layer).run(Order::Interleaved),
                     name + ": B(c) W(c+1)");
      expect_bitwise(Runner(cfg, sharding, per_layer).run(Order::FusedTwoInFlight),
                     Runner(cfg, sharding, per_layer).run(Order::TwoInFlight),
                     name + ": two micro-batches in flight");
    }
  }
  if (ran == 0) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
}

INSTANTIATE_TEST_SUITE_P(Families, SplitBackwardParallel, ::testing::Values("gpt2", "llama"));

}  // namespace
