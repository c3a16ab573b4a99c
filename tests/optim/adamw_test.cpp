// AdamW updates in chunks (so that a checkpoint copy in flight holds it back only where
// the copy has not reached): the bits must be those of one update per parameter, and the
// hook must hear of every chunk, in order, before anything in it is written.
#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "tests/fast_random.h"

namespace pentad {
namespace {

// Sizes around the chunk limit and odd ones, so chunks end at every kind of offset
// (vector bodies and scalar tails in other places than a whole-parameter update).
ParamStore make_params() {
  const int64_t chunk = static_cast<int64_t>(AdamW::kChunkElements);
  ParamStore p;
  p.add("small", Shape{7}, Init::Normal, 0.02f, false);
  p.add("matrix", Shape{33, 65}, Init::Normal, 0.02f, true);
  p.add("one_chunk", Shape{chunk}, Init::Normal, 0.02f, true);
  p.add("just_over", Shape{chunk + 1}, Init::Normal, 0.02f, false);
  p.add("three", Shape{3, chunk - 5}, Init::Normal, 0.02f, true);
  p.add("empty", Shape{0}, Init::Zeros, 0.0f, false);
  p.allocate();
  p.initialize(11);
  return p;
}

void fill_grads(ParamStore& p, uint32_t seed) {
  fast_random_fill(p.all_grads().f32(), size_t(p.numel()), seed, 0.1f);
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(AdamW, ChunkedStepIsBitwiseOneUpdatePerParameter) {
  OptimConfig cfg;
  ParamStore chunked = make_params(), whole = make_params();
  AdamW opt(cfg, chunked);
  // The reference: one kernel call per parameter, as AdamW did before it chunked.
  std::vector<float> m(static_cast<size_t>(whole.numel()), 0.0f), v(m.size(), 0.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    fill_grads(chunked, static_cast<uint32_t>(step));
    fill_grads(whole, static_cast<uint32_t>(step));
    const float lr = 1e-3f * static_cast<float>(step);
    opt.step(chunked, lr);
    for (int id = 0; id < static_cast<int>(whole.specs().size()); ++id)
      kernels::adamw_update(whole.param(id), whole.view(m.data(), id), whole.view(v.data(), id),
                            whole.grad(id), lr, cfg.beta1, cfg.beta2, cfg.eps,
                            whole.spec(id).weight_decay ? cfg.weight_decay : 0.0f, step);
    for (int id = 0; id < static_cast<int>(whole.specs().size()); ++id) {
      const int64_t n = whole.spec(id).local_shape.numel();
      EXPECT_TRUE(same_bits(chunked.param(id).f32(), whole.param(id).f32(), n))
          << whole.spec(id).name << " step " << step;
      EXPECT_TRUE(
          same_bits(chunked.view(opt.m_base(), id).f32(), whole.view(m.data(), id).f32(), n))
          << "m of " << whole.spec(id).name;
      EXPECT_TRUE(
          same_bits(chunked.view(opt.v_base(), id).f32(), whole.view(v.data(), id).f32(), n))
          << "v of " << whole.spec(id).name;
    }
  }
}

TEST(AdamW, HookHearsEveryChunkInOrderBeforeItIsWritten) {
  OptimConfig cfg;
  ParamStore p = make_params();
  AdamW opt(cfg, p);
  fill_grads(p, 1);
  opt.step(p, 1e-3f);  // nonzero moments, so every state buffer changes in the next step
  fill_grads(p, 2);
  const int64_t n = p.numel();
  const float* params = p.all_params().f32();
  const auto* m = static_cast<const float*>(opt.m_base());
  const auto* v = static_cast<const float*>(opt.v_base());
  const std::vector<float> p0(params, params + n), m0(m, m + n), v0(v, v + n);

  std::vector<std::pair<size_t, size_t>> chunks;
  opt.step(p, 1e-3f, [&](size_t begin, size_t end, size_t state_begin) {
    EXPECT_EQ(state_begin, begin);  // without ZeRO, m and v are laid out like the arena
    const auto count = static_cast<int64_t>(end - begin);
    EXPECT_TRUE(same_bits(params + begin, p0.data() + begin, count)) << "params written early";
    EXPECT_TRUE(same_bits(m + begin, m0.data() + begin, count)) << "m written early";
    EXPECT_TRUE(same_bits(v + begin, v0.data() + begin, count)) << "v written early";
    chunks.emplace_back(begin, end);
  });

  // Chunks tile each parameter in arena order, at most kChunkElements each.
  size_t next = 0;
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const size_t begin = p.spec(id).offset;
    const size_t end = begin + static_cast<size_t>(p.spec(id).local_shape.numel());
    for (size_t at = begin; at < end;) {
      ASSERT_LT(next, chunks.size()) << p.spec(id).name << " not covered";
      EXPECT_EQ(chunks[next].first, at) << p.spec(id).name;
      EXPECT_LE(chunks[next].second, end) << "a chunk crosses the end of " << p.spec(id).name;
      EXPECT_LE(chunks[next].second - chunks[next].first, AdamW::kChunkElements);
      at = chunks[next++].second;
    }
  }
  EXPECT_EQ(next, chunks.size());
  EXPECT_EQ(chunks.size(), 8u);  // 1 + 1 + 1 + 2 (just over) + 3 (three) + 0 (empty)
  EXPECT_FALSE(same_bits(params, p0.data(), n));  // and the step did update
}

// Swap snapshots: a step out of place gives the bits of the step in place, and leaves the
// state before it untouched in the spare sets (where a checkpoint is still reading it).
TEST(AdamW, StepOutOfPlaceIsBitwiseInPlaceAndKeepsThePreviousState) {
  OptimConfig cfg;
  ParamStore swapped = make_params(), in_place = make_params();
  AdamW a(cfg, swapped), b(cfg, in_place);
  swapped.allocate_spare();
  a.allocate_spare();
  const int64_t n = swapped.numel();
  for (int64_t step = 1; step <= 4; ++step) {
    fill_grads(swapped, static_cast<uint32_t>(step));
    fill_grads(in_place, static_cast<uint32_t>(step));
    const bool out_of_place = step % 2 == 0;  // alternate, as saves and plain steps do
    const std::vector<float> before(swapped.all_params().f32(), swapped.all_params().f32() + n);
    const std::vector<float> m_before(static_cast<const float*>(a.m_base()),
                                      static_cast<const float*>(a.m_base()) + n);
    const void* live = swapped.all_params().data;
    a.step(swapped, 1e-3f, {}, out_of_place);
    b.step(in_place, 1e-3f);
    EXPECT_TRUE(same_bits(swapped.all_params().f32(), in_place.all_params().f32(), n)) << step;
    EXPECT_TRUE(
        same_bits(static_cast<const float*>(a.m_base()), static_cast<const float*>(b.m_base()), n));
    EXPECT_TRUE(
        same_bits(static_cast<const float*>(a.v_base()), static_cast<const float*>(b.v_base()), n));
    EXPECT_EQ(swapped.all_params().data != live, out_of_place) << "the sets swap roles";
    if (out_of_place) {  // the previous live set is now the spare one, untouched
      EXPECT_TRUE(same_bits(swapped.spare_params().f32(), before.data(), n));
      a.swap_state();  // and back: the moments before the step
      EXPECT_TRUE(same_bits(static_cast<const float*>(a.m_base()), m_before.data(), n));
      a.swap_state();
    }
  }
  ParamStore plain = make_params();
  AdamW c(cfg, plain);
  EXPECT_ANY_THROW(c.step(plain, 1e-3f, {}, true));  // no spare sets: refused
}

}  // namespace
}  // namespace pentad
