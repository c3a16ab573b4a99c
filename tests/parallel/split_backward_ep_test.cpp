// The backward in two passes (Model::backward_chunk_input, B, then backward_chunk_weights,
// W; model/split_backward_moe.cpp) of MoE layers under expert parallelism, on 4 ranks: ep 2
// (over dp), ep 4, and ep 2 x etp 2. Each data-parallel rank routes its own tokens (its dp
// rank seeds them), so the dispatch's all-to-alls move uneven counts. Against the fused
// backward_chunk at the same layout, on every rank: every parameter gradient (router, this rank's
// experts, shared experts, dense layers), the input gradient and the gradient reports bitwise
// equal, for B and W in several orders over two micro-batches, one chunk and a chunk per layer.
// Also with MoE layers under tp with sequence parallelism (1D and 2D), cp (ring, and Ulysses
// with ep), tp with ep, and two of them with recompute. B runs the dispatch's all-to-alls, W
// nothing on the ep and etp groups (the communication trace, parallel/trace.h, counts what
// each pass issued; under sequence parallelism W's last micro-batch sums the norms' partial
// gradients over tp, as the dense layers' W does).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "launch/rank.h"
#include "parallel/mesh.h"
#include "parallel/trace.h"
#include "plan/layout.h"
#include "recipe/recipe.h"
#include "train/parallelize.h"

using namespace pentad;

namespace {

constexpr int64_t kVocab = 96;

struct Layout {
  const char* name;
  std::vector<std::string> keys;
  int ranks;  // the ranks one micro-batch's layers span (ep x etp, tp x cp)
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"ep 2", {"parallel.ep=2"}, 2},
      {"ep 4", {"parallel.ep=4"}, 4},
      {"ep 2 x etp 2", {"parallel.ep=2", "parallel.etp=2"}, 4},
      {"tp 2 + sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}, 2},
      {"tp 2x2 + sp",
       {"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.sequence_parallel=true"},
       4},
      {"cp 2 ring", {"parallel.cp=2", "parallel.cp_impl=\"ring\""}, 2},
      {"cp 2 ulysses x ep 2",
       {"parallel.cp=2", "parallel.cp_impl=\"ulysses\"", "parallel.ep=2"},
       2},
      {"tp 2 + sp x ep 2",
       {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"},
       2},
      // Recompute: B rebuilds each layer, its dispatch included, as the fused backward.
      {"ep 2 x etp 2, recompute", {"parallel.ep=2", "parallel.etp=2", "model.recompute=true"}, 4},
      {"tp 2x2 + sp, recompute",
       {"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.sequence_parallel=true",
        "model.recompute=true"},
       4},
  };
  return all;
}

// gpt2: GELU experts and a shared expert; llama: SwiGLU experts (Mixtral's), none shared.
Config recipe(const std::string& family, const Layout& layout) {
  std::vector<std::string> keys = {"model.family=" + family,
                                   "model.n_layer=3",
                                   "model.d_model=32",
                                   "model.n_head=4",
                                   "model.d_ff=64",
                                   "model.vocab_size=96",
                                   "model.max_seq_len=16",
                                   "model.n_experts=4",
                                   "model.top_k=2",
                                   "model.d_ff_expert=32",
                                   "model.moe_layers=\"all\"",
                                   "moe.aux_loss_coef=0.01",
                                   "moe.z_loss_coef=0.001",
                                   "train.seq_len=16",
                                   "train.micro_batch=2",
                                   "train.threads=1",
                                   "data.source=random"};
  if (family == "llama") keys.push_back("model.n_kv_head=2");
  if (family == "gpt2") keys.push_back("model.n_shared_experts=1");
  keys.insert(keys.end(), layout.keys.begin(), layout.keys.end());
  return parse_recipe("", "split-backward-ep-test", keys);
}

std::vector<LayerRange> chunk_layout(const ModelConfig& cfg, bool per_layer) {
  if (!per_layer) return {};
  std::vector<LayerRange> chunks;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    chunks.push_back({l, l + 1, l == 0, l + 1 == cfg.n_layer});
  return chunks;
}

// This rank's gradients, d(model input), and the offsets reported final (repeats dropped);
// the collectives the split's B and W issued.
struct Result {
  std::vector<float> grads, input_grad;
  std::vector<int64_t> ready;
  size_t b_expert_collectives = 0, w_expert_collectives = 0;  // on the ep and etp groups
};

// Fused: backward_chunk. EveryBThenEveryW and Interleaved (B(c) W(c + 1)) per micro-batch in
// one slot; TwoInFlight: both forwards in two slots, then B(c) of 1 with W(c) of 0;
// FusedTwoInFlight, its reference: both forwards, then each one's fused backward (a tied
// head adds its gradient in the forward: wte's then sums in another order than Fused's).
enum class Order { Fused, EveryBThenEveryW, Interleaved, TwoInFlight, FusedTwoInFlight };

class EpRunner {
 public:
  // data_rank: whose micro-batches (the tp and cp ranks of one share them).
  EpRunner(const Config& cfg, const Sharding& sharding, bool per_layer, int data_rank)
      : cfg_(cfg),
        t_(cfg.train.seq_len / (sharding.cp ? sharding.cp->degree() : 1)),
        data_rank_(data_rank),
        model_(cfg.model, cfg.train.micro_batch, t_, sharding, chunk_layout(cfg.model, per_layer)),
        arena_("d_output", 2 * size_t(model_.rows() * cfg.model.d_model) * sizeof(float) + 512),
        d_{arena_.alloc(Shape{model_.rows(), cfg.model.d_model}),
           arena_.alloc(Shape{model_.rows(), cfg.model.d_model})} {
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
            model_.backward_chunk(c, s, d_[0], s == 1, listen_);
            copy(d_[0], model_.input_grad());
          }
        return result();
      }
      for (int c = top; c >= 0; --c) input(c, 0);
      for (int c = top; c >= 0; --c) {
        input(c, 1);
        weights(c, 0, false);
      }
      for (int c = top; c >= 0; --c) weights(c, 1, true);
      return result();
    }
    for (int micro = 0; micro < 2; ++micro) {
      forward(micro, 0);
      const bool last = micro == 1;
      if (order == Order::Fused) {
        for (int c = top; c >= 0; --c) {
          model_.backward_chunk(c, 0, d_[0], last, listen_);
          copy(d_[0], model_.input_grad());
        }
      } else if (order == Order::EveryBThenEveryW) {
        for (int c = top; c >= 0; --c) input(c, 0);
        for (int c = top; c >= 0; --c) weights(c, 0, last);
      } else {
        input(top, 0);
        for (int c = top - 1; c >= 0; --c) {
          input(c, 0);
          weights(c + 1, 0, last);
        }
        weights(0, 0, last);
      }
    }
    return result();
  }

 private:
  // Micro-batch `micro` of this data rank (its ids differ from every other's) in `slot`.
  void forward(int micro, int slot) {
    const size_t n = size_t(cfg_.train.micro_batch * t_);
    const uint64_t seed = 100 * uint64_t(micro) + 10000 * uint64_t(data_rank_);
    std::vector<int32_t> in(n), tg(n);
    for (size_t i = 0; i < n; ++i) {
      in[i] = static_cast<int32_t>(splitmix64(i + seed) % kVocab);
      tg[i] = static_cast<int32_t>(splitmix64(i + 1000 + seed) % kVocab);
    }
    for (int c = 0; c < model_.chunks(); ++c) {
      if (c > 0) copy(model_.chunk_input(c, slot), model_.chunk_output(c - 1, slot));
      model_.forward_chunk(c, slot, c == 0 ? in.data() : nullptr,
                           c + 1 == model_.chunks() ? tg.data() : nullptr, 1.0f / float(n));
    }
  }
  void input(int c, int slot) {
    parallel::clear_comm_events();
    model_.backward_chunk_input(c, slot, d_[slot]);
    r_.b_expert_collectives += expert_collectives();
    copy(d_[slot], model_.input_grad());
  }
  void weights(int c, int slot, bool last) {
    parallel::clear_comm_events();
    model_.backward_chunk_weights(c, slot, last, listen_);
    r_.w_expert_collectives += expert_collectives();
  }
  static size_t expert_collectives() {
    size_t n = 0;
    for (const parallel::CommEvent& e : parallel::comm_events())
      n += e.name() == "ep" || e.name() == "etp";
    return n;
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
  int data_rank_;
  Model model_;
  Arena arena_;
  Tensor d_[2];
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

class SplitBackwardEp : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitBackwardEp, EqualsTheFusedBackwardBitwise) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int ran = 0;
  for (const Layout& layout : layouts()) {
    if (world % layout.ranks != 0) continue;
    const Config cfg = recipe(GetParam(), layout);
    launch::start_rank(cfg);
    parallel::Mesh mesh = parallel::Mesh::create(mesh_config(cfg, world), MPI_COMM_WORLD);
    ModelWiring wiring;
    parallelize(cfg, &mesh, Placement{}, wiring);  // the hooks; the models are built below
    const Sharding sharding{wiring.tp.get(), wiring.ep.get(), wiring.cp.get()};
    const int spread = (sharding.tp ? sharding.tp->degree() : 1) *
                       (sharding.cp ? sharding.cp->degree() : 1) *
                       (sharding.ep ? sharding.ep->ep_degree() * sharding.ep->etp_degree() : 1);
    ASSERT_GE(spread, layout.ranks) << layout.name;
    const int data_rank = mesh.group(parallel::Axis::DP).rank();
    ++ran;
    for (bool per_layer : {false, true}) {
      const std::string name =
          std::string(layout.name) + (per_layer ? ", a chunk per layer" : ", one chunk");
      const Result want = EpRunner(cfg, sharding, per_layer, data_rank).run(Order::Fused);
      double norm = 0;
      for (float x : want.grads) norm += double(x) * x;
      EXPECT_GT(norm, 0.0) << name;
      EXPECT_FALSE(want.ready.empty()) << name;
      const Result split =
          EpRunner(cfg, sharding, per_layer, data_rank).run(Order::EveryBThenEveryW);
      expect_bitwise(want, split, name + ": every B, then every W");
      if (sharding.ep) {
        EXPECT_GT(split.b_expert_collectives, 0u) << name;  // the dispatch and the combine
      }
      EXPECT_EQ(split.w_expert_collectives, 0u) << name;
      expect_bitwise(want, EpRunner(cfg, sharding, per_layer, data_rank).run(Order::Interleaved),
                     name + ": B(c) W(c+1)");
      expect_bitwise(EpRunner(cfg, sharding, per_layer, data_rank).run(Order::FusedTwoInFlight),
                     EpRunner(cfg, sharding, per_layer, data_rank).run(Order::TwoInFlight),
                     name + ": two micro-batches in flight");
    }
  }
  if (ran == 0) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
}

INSTANTIATE_TEST_SUITE_P(Families, SplitBackwardEp, ::testing::Values("gpt2", "llama"));

}  // namespace
