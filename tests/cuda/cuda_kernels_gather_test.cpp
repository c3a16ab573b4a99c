// cuda_kernels_test: the ops that gather and scatter rows by index against the CPU: the
// embedding (by token and by position) and MoE's permutation of tokens to experts and
// back (the program, its fixtures and bounds: cuda_kernels_test.h).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/cuda_kernels_test.h"

namespace pentad::cuda_kernels {
namespace {

// ---- embedding ----

struct EmbedCase {
  int64_t B, T, V, C, vocab_start, table_rows;  // vocab_start < 0: the whole table
  bool positions;
};
const EmbedCase kEmbedCases[] = {{1, 1, 1, 1, -1, 1, true},      {2, 7, 3, 5, -1, 3, true},
                                 {4, 64, 50, 768, -1, 50, true}, {3, 33, 1000, 96, -1, 1000, false},
                                 {2, 40, 9, 64, 3, 4, false},    {8, 256, 2, 33, -1, 2, true}};

std::string str(const EmbedCase& c) {
  return "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " V " + std::to_string(c.V) +
         " C " + std::to_string(c.C) + " start " + std::to_string(c.vocab_start);
}

TEST_P(CudaKernel, EmbeddingForward) {
  for (const EmbedCase& c : kEmbedCases) {
    const auto tokens = random_ids(c.B * c.T, c.V, 23);
    const auto wte = rand(c.table_rows * c.C), wpe = rand(c.T * c.C);
    std::vector<float> out(c.B * c.T * c.C);
    const Shape out_shape{c.B, c.T, c.C};
    k::embedding_forward(view(out, out_shape), view(tokens, {c.B, c.T}),
                         view(wte, {c.table_rows, c.C}),
                         c.positions ? view(wpe, {c.T, c.C}) : Tensor{}, c.vocab_start);
    const Tensor gout = gpu.poisoned(out_shape, dt());
    k::embedding_forward(gout, gpu.upload_ids(tokens, {c.B, c.T}),
                         gpu.upload(wte, {c.table_rows, c.C}, dt()),
                         c.positions ? gpu.upload(wpe, {c.T, c.C}, dt()) : Tensor{}, c.vocab_start);
    expect_close("embedding forward " + str(c), gout, out, dt());
  }
}

// Gradients go to F32 tables in position order, starting from the table's value, exactly
// as on the CPU: with F32 data the result is bitwise the CPU's, and it never varies.
TEST_P(CudaKernel, EmbeddingBackward) {
  for (const EmbedCase& c : kEmbedCases) {
    const auto tokens = random_ids(c.B * c.T, c.V, 29);
    const auto dout = rand(c.B * c.T * c.C);
    const auto dwte0 = random(DType::F32, c.table_rows * c.C, 96);
    const auto dwpe0 = random(DType::F32, c.T * c.C, 97);
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    const Shape out_shape{c.B, c.T, c.C};
    k::embedding_backward(view(dwte, {c.table_rows, c.C}),
                          c.positions ? view(dwpe, {c.T, c.C}) : Tensor{}, view(dout, out_shape),
                          view(tokens, {c.B, c.T}), c.vocab_start);
    const Tensor gtokens = gpu.upload_ids(tokens, {c.B, c.T});
    const Tensor gdout = gpu.upload(dout, out_shape, dt());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      const Tensor gdwte = gpu.upload(dwte0, {c.table_rows, c.C}, DType::F32);
      const Tensor gdwpe = gpu.upload(dwpe0, {c.T, c.C}, DType::F32);
      k::embedding_backward(gdwte, c.positions ? gdwpe : Tensor{}, gdout, gtokens, c.vocab_start);
      const auto got = download(gdwte);
      if (run == 0) {
        expect_close("dwte " + str(c), got, dwte, tolerance(dt()));
        if (c.positions) expect_close("dwpe " + str(c), gdwpe, dwpe, dt());
        if (dt() == DType::F32) {
          EXPECT_TRUE(bitwise_equal(got, dwte)) << "dwte not bitwise the CPU's " << str(c);
        }
        first = got;
      } else {
        EXPECT_TRUE(bitwise_equal(first, got)) << "embedding backward varies " << str(c);
      }
    }
  }
}

// wpe rows by position, and dwpe scattered by position: zig-zag chunks, and a repeated
// position whose dout rows add in token order (with F32 data bitwise the CPU's sums).
TEST_P(CudaKernel, EmbeddingWithPositions) {
  const std::vector<int32_t> position_sets[] = {
      {0, 1, 2, 3, 12, 13, 14, 15}, {2, 2, 2, 5, 9, 9, 30}, {31}};
  const int64_t B = 3, V = 11, C = 70, P = 32;
  for (const auto& pos : position_sets) {
    const int64_t T = static_cast<int64_t>(pos.size());
    const auto tokens = random_ids(B * T, V, 41);
    const auto wte = rand(V * C), wpe = rand(P * C), dout = rand(B * T * C);
    const auto dwpe0 = random(DType::F32, P * C, 42);
    const std::string what = "embedding positions T " + std::to_string(T);
    std::vector<float> out(B * T * C), dwpe = dwpe0;
    k::embedding_forward(view(out, {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                         view(wpe, {P, C}), -1, view(pos, {T}));
    k::embedding_backward(Tensor{}, view(dwpe, {P, C}), view(dout, {B, T, C}), view(tokens, {B, T}),
                          -1, view(pos, {T}));
    const Tensor gpos = gpu.upload_ids(pos, {T}), gtokens = gpu.upload_ids(tokens, {B, T});
    const Tensor gout = gpu.poisoned({B, T, C}, dt());
    k::embedding_forward(gout, gtokens, gpu.upload(wte, {V, C}, dt()),
                         gpu.upload(wpe, {P, C}, dt()), -1, gpos);
    expect_close(what + " forward", gout, out, dt());
    const Tensor gdwpe = gpu.upload(dwpe0, {P, C}, DType::F32);
    k::embedding_backward(Tensor{}, gdwpe, gpu.upload(dout, {B, T, C}, dt()), gtokens, -1, gpos);
    const auto got = download(gdwpe);
    expect_close(what + " dwpe", got, dwpe, tolerance(dt()));
    if (dt() == DType::F32) {
      EXPECT_TRUE(bitwise_equal(got, dwpe)) << what << ": dwpe not bitwise the CPU's";
    }
  }
}

// ---- MoE permutation ----

struct MoeCase {
  int64_t N, k, C;
  int64_t drop_every;  // every drop_every-th pick is dropped by capacity (0: none)
};
// Zero tokens, one of everything, every pick dropped, and odd sizes up to k = 4.
const MoeCase kMoeCases[] = {{0, 2, 5, 0},   {1, 1, 1, 0},   {7, 2, 3, 3},     {5, 2, 9, 1},
                             {13, 3, 33, 5}, {64, 4, 96, 7}, {129, 4, 257, 2}, {50, 1, 768, 4}};

std::string str(const MoeCase& c) {
  return "N " + std::to_string(c.N) + " k " + std::to_string(c.k) + " C " + std::to_string(c.C) +
         " drop every " + std::to_string(c.drop_every);
}

// A routing as MoeBlock::route leaves it: pos (N, k) sends each kept pick to its own row of
// the expert-ordered buffer (rows 0..A-1, shuffled), -1 for a dropped pick; src (A) is the
// token of each row.
struct Routing {
  int64_t A = 0;
  std::vector<int32_t> pos, src;
};

Routing routing(const MoeCase& c, uint64_t seed) {
  Routing r;
  const int64_t picks = c.N * c.k;
  auto dropped = [&](int64_t i) {
    return c.drop_every > 0 && i % c.drop_every == c.drop_every - 1;
  };
  for (int64_t i = 0; i < picks; ++i) r.A += dropped(i) ? 0 : 1;
  std::vector<int32_t> rows(static_cast<size_t>(r.A));
  for (size_t a = 0; a < rows.size(); ++a) rows[a] = static_cast<int32_t>(a);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(seed));
  r.pos.assign(static_cast<size_t>(picks), -1);
  r.src.assign(static_cast<size_t>(r.A), 0);
  size_t next = 0;
  for (int64_t i = 0; i < picks; ++i)
    if (!dropped(i)) {
      r.pos[size_t(i)] = rows[next++];
      r.src[size_t(r.pos[size_t(i)])] = static_cast<int32_t>(i / c.k);
    }
  return r;
}

// A CPU view that stays present with no elements (view() of an empty vector is absent, and
// the doors refuse an absent required argument).
template <typename T>
Tensor host(const std::vector<T>& v, Shape shape) {
  static T spare{};
  Tensor t = view(v, shape);
  if (!t.data) t.data = &spare;
  return t;
}

// A row copy: exact in either dtype.
TEST_P(CudaKernel, MoePermute) {
  for (const MoeCase& c : kMoeCases) {
    const Routing r = routing(c, 31);
    const auto x = rand(c.N * c.C);
    std::vector<float> want(r.A * c.C);
    k::moe_permute(host(want, {r.A, c.C}), host(x, {c.N, c.C}), host(r.src, {r.A}));
    const Tensor out = gpu.poisoned({r.A, c.C}, dt());
    k::moe_permute(out, gpu.upload(x, {c.N, c.C}, dt()), gpu.upload_ids(r.src, {r.A}));
    EXPECT_TRUE(bitwise_equal(download(out), want)) << "moe_permute " << str(c);
  }
}

// Weighted or not, overwriting or accumulating into random values; w in F32 with either dtype.
TEST_P(CudaKernel, MoeUnpermute) {
  for (const MoeCase& c : kMoeCases) {
    const Routing r = routing(c, 37);
    const auto y = rand(r.A * c.C), w = random(DType::F32, c.N * c.k, 41), out0 = rand(c.N * c.C);
    const Tensor gy = gpu.upload(y, {r.A, c.C}, dt()), gpos = gpu.upload_ids(r.pos, {c.N, c.k});
    const Tensor gw = gpu.upload(w, {c.N, c.k}, DType::F32);
    for (bool weighted : {true, false})
      for (bool accumulate : {false, true}) {
        std::vector<float> want = out0;
        k::moe_unpermute(host(want, {c.N, c.C}), host(y, {r.A, c.C}), host(r.pos, {c.N, c.k}),
                         weighted ? host(w, {c.N, c.k}) : Tensor{}, accumulate);
        const Tensor out =
            accumulate ? gpu.upload(out0, {c.N, c.C}, dt()) : gpu.poisoned({c.N, c.C}, dt());
        k::moe_unpermute(out, gy, gpos, weighted ? gw : Tensor{}, accumulate);
        expect_close("moe_unpermute " + str(c) + (weighted ? " weighted" : "") +
                         (accumulate ? " accumulate" : ""),
                     out, want, dt());
      }
  }
}

// dinp (every row has one writer) and dw (0 for a dropped pick, F32), twice: the same bits.
TEST_P(CudaKernel, MoeUnpermuteBackward) {
  for (const MoeCase& c : kMoeCases) {
    const Routing r = routing(c, 43);
    const auto y = rand(r.A * c.C), dout = rand(c.N * c.C), w = random(DType::F32, c.N * c.k, 47);
    std::vector<float> dy(r.A * c.C), dw(c.N * c.k);
    k::moe_unpermute_backward(host(dy, {r.A, c.C}), host(dw, {c.N, c.k}), host(dout, {c.N, c.C}),
                              host(y, {r.A, c.C}), host(r.pos, {c.N, c.k}), host(w, {c.N, c.k}));
    const Tensor gy = gpu.upload(y, {r.A, c.C}, dt()), gdout = gpu.upload(dout, {c.N, c.C}, dt());
    const Tensor gpos = gpu.upload_ids(r.pos, {c.N, c.k});
    const Tensor gw = gpu.upload(w, {c.N, c.k}, DType::F32);
    std::vector<float> first_dy, first_dw;
    for (int run = 0; run < 2; ++run) {
      const Tensor gdy = gpu.poisoned({r.A, c.C}, dt()), gdw = gpu.poisoned({c.N, c.k}, DType::F32);
      k::moe_unpermute_backward(gdy, gdw, gdout, gy, gpos, gw);
      const auto got_dy = download(gdy), got_dw = download(gdw);
      if (run == 0) {
        expect_close("moe_unpermute_backward dinp " + str(c), got_dy, dy, tolerance(dt()));
        expect_close("moe_unpermute_backward dw " + str(c), got_dw, dw, tolerance(dt()));
        for (size_t i = 0; i < r.pos.size(); ++i) {
          if (r.pos[i] < 0) {
            EXPECT_EQ(got_dw[i], 0.0f) << "dropped pick " << i << " " << str(c);
          }
        }
        first_dy = got_dy;
        first_dw = got_dw;
      } else {
        EXPECT_TRUE(bitwise_equal(first_dy, got_dy) && bitwise_equal(first_dw, got_dw))
            << "moe_unpermute_backward varies " << str(c);
      }
    }
  }
}

}  // namespace
}  // namespace pentad::cuda_kernels
