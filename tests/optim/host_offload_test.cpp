// AdamW's state offloaded to host memory (optim/host_offload.h, parallel.offload = "cpu" on a
// GPU). Here the parameters are host memory too, so the copies are memcpy and nothing runs
// on a device: what is checked is the chunk plan, the staging (two slots taking turns), the
// gradients' source (the full arena, or the compact ZeRO shares) and that an AdamW step
// through the host is bitwise the step without it; and the same with the moments on NVMe
// (parallel.offload = "nvme" on a GPU: optim/nvme_state.h's sub-groups outside, the staging's
// chunks inside each), and with ZeRO-3's parameter shares in the file as well
// (parallel.offload_params: only the gradients staged, the parameters updated in the file).
// The device streams are covered by the GPU suite
// (tests/cuda/cuda_train_test.cpp, CpuOffload and NvmeOffload: compiled, run only on a GPU).
#include "optim/host_offload.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/nvme_state.h"
#include "tests/fast_random.h"

namespace pentad {
namespace {

const int64_t kChunk = int64_t(AdamW::kChunkElements);

ParamStore make_offload_params() {
  ParamStore p;
  p.add("small", Shape{7}, Init::Normal, 0.02f, false);
  p.add("matrix", Shape{33, 65}, Init::Normal, 0.02f, true);
  p.add("just_over", Shape{kChunk + 1}, Init::Normal, 0.02f, false);
  p.add("three", Shape{3, kChunk - 5}, Init::Normal, 0.02f, true);
  p.add("empty", Shape{0}, Init::Zeros, 0.0f, false);
  p.allocate();
  p.initialize(11);
  return p;
}

// A ZeRO-like shard: rows 10.. of "matrix" and row 1.. of "three" (compact: one after the
// other).
StateShard some_rows(const ParamStore& p) {
  const ParamSpec& matrix = p.spec(p.find("matrix"));
  const ParamSpec& three = p.spec(p.find("three"));
  const int64_t m0 = int64_t(matrix.offset) + 10 * 65, m1 = int64_t(matrix.offset) + 33 * 65;
  const int64_t t0 = int64_t(three.offset) + (kChunk - 5),
                t1 = int64_t(three.offset) + three.local_shape.numel();
  return {{{m0, m1, 0}, {t0, t1, m1 - m0}}, (m1 - m0) + (t1 - t0)};
}

// The same rows as a merged shard (StateShard::merge, as MoE's ZeRO builds it: one
// reducer's shares, then the other's) whose compact layout puts "three" before "matrix":
// state order is not arena order.
StateShard some_rows_reordered(const ParamStore& p) {
  const StateShard rows = some_rows(p);
  const StateShard::Range m = rows.ranges[0], t = rows.ranges[1];
  return StateShard::merge({{{t.begin, t.end, 0}}, t.end - t.begin},
                           {{{m.begin, m.end, 0}}, m.end - m.begin});
}

std::vector<float> random_grads(int64_t n, uint32_t seed) {
  return fast_random(size_t(n), seed, 0.1f);
}

TEST(HostOffload, PlanTilesTheShardInChunksInsideParameters) {
  const ParamStore p = make_offload_params();
  for (const StateShard& shard : {StateShard::whole(p.numel()), some_rows(p)}) {
    const bool whole = shard.is_whole(p.numel());
    SCOPED_TRACE(whole ? "whole arena" : "ZeRO shard");
    const std::vector<HostChunk> chunks = plan_host_chunks(p, shard, 1000);
    int64_t covered = 0, wanted = 0, end = 0;
    for (const ParamSpec& spec : p.specs())
      for (const StateShard::Piece& piece : shard.pieces(spec)) wanted += piece.count;
    for (const HostChunk& c : chunks) {
      const ParamSpec& spec = p.spec(c.id);
      // The whole arena's layout has the padding between parameters; a ZeRO shard's none.
      if (whole) {
        EXPECT_GE(c.state, end);
        EXPECT_EQ(c.state, c.arena);
      } else {
        EXPECT_EQ(c.state, end) << "chunks follow the compact layout without gaps";
      }
      EXPECT_GT(c.count, 0);
      EXPECT_LE(c.count, 1000);
      EXPECT_GE(c.arena, int64_t(spec.offset));
      EXPECT_LE(c.arena + c.count, int64_t(spec.offset) + spec.local_shape.numel())
          << spec.name << ": a chunk stays inside its parameter";
      end = c.state + c.count;
      covered += c.count;
    }
    EXPECT_EQ(covered, wanted);
    if (!whole) {
      EXPECT_EQ(end, shard.numel);
    }
  }
  // A parameter is cut into equal chunks: "just_over" (kChunk + 1) into two, not kChunk and 1.
  const std::vector<HostChunk> chunks = plan_host_chunks(p, StateShard::whole(p.numel()), kChunk);
  for (const HostChunk& c : chunks) {
    if (p.spec(c.id).name != "just_over") continue;
    EXPECT_GE(c.count, kChunk / 2);
  }
}

// Small chunks, so that the two staging slots take many turns: each chunk's update must see
// its own parameters and gradients, and its result must land at its own place.
TEST(HostOffload, EveryChunkUpdatesItsOwnValuesThroughTheStaging) {
  ParamStore p = make_offload_params();
  const StateShard shard = some_rows(p);
  const std::vector<float> before(p.all_params().f32(), p.all_params().f32() + p.numel());
  const std::vector<float> grads = random_grads(shard.numel, 3);
  HostOffload offload(p, shard, 777);
  ASSERT_GT(offload.chunks().size(), 100u);
  size_t heard = 0;
  offload.step(
      p, view_of(const_cast<float*>(grads.data()), Shape{shard.numel}),
      [](const HostChunk& c, float* values, const float* g) {
        for (int64_t i = 0; i < c.count; ++i) values[i] = 2 * values[i] + g[i];
      },
      [&](const HostChunk& c) { EXPECT_EQ(&c, &offload.chunks()[heard++]) << "in order"; });
  EXPECT_EQ(heard, offload.chunks().size());
  const float* after = p.all_params().f32();
  int64_t wrong = 0;
  for (int64_t i = 0; i < p.numel(); ++i) {
    float want = before[size_t(i)];  // outside the shard: untouched
    for (const StateShard::Range& r : shard.ranges)
      if (r.begin <= i && i < r.end) want = 2 * want + grads[size_t(r.shard + (i - r.begin))];
    wrong += after[i] != want ? 1 : 0;
  }
  EXPECT_EQ(wrong, 0) << "values of " << p.numel() << " not updated from their own chunk";
}

// AdamW with its state on the host against AdamW without: the same bits, for the whole arena
// (gradients read from the gradient arena) and for a ZeRO shard (compact gradients).
TEST(HostOffload, AdamWStepThroughTheHostIsBitwiseTheStepInPlace) {
  OptimConfig cfg;
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "ZeRO shard" : "whole arena");
    ParamStore plain = make_offload_params(), hosted = make_offload_params();
    const StateShard shard = sharded ? some_rows(plain) : StateShard::whole(plain.numel());
    AdamW a(cfg, plain, shard), b(cfg, hosted, shard, nullptr, "", false, /*on_host=*/true);
    EXPECT_TRUE(b.on_host());
    EXPECT_EQ(b.state_device(), Device::CPU);
    EXPECT_GT(b.host_staging_bytes(), 0u);
    for (int64_t step = 1; step <= 3; ++step) {
      const int64_t n = sharded ? shard.numel : plain.numel();
      std::vector<float> g = random_grads(n, uint32_t(step));
      const Tensor grads = view_of(g.data(), Shape{n});
      if (!sharded) {
        std::memcpy(plain.all_grads().data, g.data(), g.size() * sizeof(float));
        std::memcpy(hosted.all_grads().data, g.data(), g.size() * sizeof(float));
      }
      const float lr = 1e-3f * float(step);
      a.step(plain, lr, {}, false, sharded ? grads : Tensor{});
      b.step(hosted, lr, {}, false, sharded ? grads : Tensor{});
    }
    EXPECT_EQ(std::memcmp(plain.all_params().data, hosted.all_params().data, plain.bytes()), 0);
    const size_t state = size_t(shard.numel) * sizeof(float);
    EXPECT_EQ(std::memcmp(a.m_base(), b.m_base(), state), 0);
    EXPECT_EQ(std::memcmp(a.v_base(), b.v_base(), state), 0);
  }
}

// Gradients brought down during backward (the trainer's early downloads, bucket by bucket):
// the chunks lying wholly inside what came down take their gradients there, the others at the
// step; both are clipped on the host by the step's coefficient (the device's copy is never
// scaled). A download covering part of a chunk does not count for it, what came down before
// a step's forget_early_grads() does not count at all, and the result is bitwise the step in
// place on gradients clipped by clip_gradients.
TEST(HostOffload, GradientsBroughtDownEarlyAreBitwiseTheStepInPlace) {
  OptimConfig cfg;
  ParamStore plain = make_offload_params(), hosted = make_offload_params();
  const StateShard shard = some_rows_reordered(plain);
  AdamW a(cfg, plain, shard), b(cfg, hosted, shard, nullptr, "", false, /*on_host=*/true);
  const size_t staging = b.host_staging_bytes();
  b.reserve_early_grads();
  EXPECT_GE(b.host_staging_bytes(), staging + size_t(shard.numel) * sizeof(float));
  EXPECT_LT(b.host_staging_bytes(), staging + size_t(shard.numel) * sizeof(float) + 4096);
  const int64_t n = shard.numel, half = n / 2 + 3;  // not at a chunk boundary
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> g = random_grads(n, uint32_t(step));
    const float coefficient = step == 2 ? 1.0f : 0.25f * float(step);
    std::vector<float> clipped = g;  // as the CPU's clip_gradients scales them
    for (float& x : clipped) x *= coefficient;
    b.forget_early_grads();
    // A stale download of another step's gradients: forgotten.
    if (step == 1) b.download_early_grads(random_grads(n, 99).data(), 0, n);
    b.forget_early_grads();
    b.download_early_grads(g.data(), half, n - half);  // the second part, as reduced
    b.download_early_grads(g.data(), 0, 5);            // a sliver of the first chunk
    b.scale_grads_on_host(coefficient);
    const float lr = 1e-3f * float(step);
    a.step(plain, lr, {}, false, view_of(clipped.data(), Shape{n}));
    b.step(hosted, lr, {}, false, view_of(g.data(), Shape{n}));  // the device's copy: unclipped
    size_t inside = 0;
    for (const HostChunk& c : plan_host_chunks(hosted, shard, kChunk))
      inside += c.state >= half ? 1 : 0;
    EXPECT_EQ(b.early_grad_chunks(), inside) << "step " << step;
  }
  EXPECT_GT(b.early_grad_chunks(), 0u);
  EXPECT_LT(b.early_grad_chunks(), b.host_chunks());
  EXPECT_EQ(std::memcmp(plain.all_params().data, hosted.all_params().data, plain.bytes()), 0);
  const size_t state = size_t(shard.numel) * sizeof(float);
  EXPECT_EQ(std::memcmp(a.m_base(), b.m_base(), state), 0);
  EXPECT_EQ(std::memcmp(a.v_base(), b.v_base(), state), 0);
}

// Cut at sub-groups (the NVMe path): every chunk lies inside one sub-group of the shard's
// layout, the chunks still tile the same elements, and chunks_in() finds exactly the chunks of
// each sub-group.
TEST(HostOffload, PlanCutAtSubGroupsKeepsEachChunkInsideOne) {
  const ParamStore p = make_offload_params();
  const int64_t group = 3001;  // divides neither the chunks nor the parameters
  const char* names[] = {"whole arena", "ZeRO shard", "merged ZeRO shard"};
  const StateShard shards[] = {StateShard::whole(p.numel()), some_rows(p), some_rows_reordered(p)};
  for (int which = 0; which < 3; ++which) {
    const StateShard& shard = shards[which];
    SCOPED_TRACE(names[which]);
    const std::vector<HostChunk> plain = plan_host_chunks(p, shard, 1000);
    const std::vector<HostChunk> cut = plan_host_chunks(p, shard, 1000, group);
    EXPECT_GT(cut.size(), plain.size());
    int64_t plain_elements = 0, cut_elements = 0, end = 0;
    for (const HostChunk& c : plain) plain_elements += c.count;
    for (const HostChunk& c : cut) {
      EXPECT_GT(c.count, 0);
      EXPECT_LE(c.count, 1000);
      EXPECT_GE(c.state, end) << "in state order, not overlapping";
      EXPECT_EQ(c.state / group, (c.state + c.count - 1) / group)
          << "chunk at " << c.state << " (+" << c.count << ") crosses a sub-group boundary";
      // Its parameters where its moments say: the same range of the shard's layout.
      int64_t inside = 0;
      for (const StateShard::Range& r : shard.ranges)
        if (r.begin <= c.arena && c.arena + c.count <= r.end &&
            c.state == r.shard + (c.arena - r.begin))
          ++inside;
      EXPECT_EQ(inside, 1) << "chunk at arena " << c.arena << ", state " << c.state;
      end = c.state + c.count;
      cut_elements += c.count;
    }
    EXPECT_EQ(cut_elements, plain_elements);
    HostOffload offload(p, shard, 1000, group);
    size_t next = 0;
    for (int64_t begin = 0; begin < shard.numel; begin += group) {
      const auto range = offload.chunks_in(begin, std::min(begin + group, shard.numel));
      EXPECT_EQ(range.first, next) << "sub-group at " << begin;
      for (size_t k = range.first; k < range.second; ++k) {
        EXPECT_GE(offload.chunks()[k].state, begin);
        EXPECT_LE(offload.chunks()[k].state + offload.chunks()[k].count, begin + group);
      }
      next = range.second;
    }
    EXPECT_EQ(next, offload.chunks().size()) << "every chunk in some sub-group";
  }
}

class NvmeDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/pentad-host-nvme-test-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Sub-groups that divide neither the chunks nor the parameters; small requests.
  NvmeOptions options() const {
    NvmeOptions nvme;
    nvme.dir = dir_;
    nvme.subgroup_elements = 300007;
    nvme.block_bytes = 64 << 10;
    nvme.queue_depth = 4;
    return nvme;
  }
  std::string dir_;
};

// The moments on NVMe, updated on the host from parameters that come down and go back up
// through the staging (what a CUDA run with parallel.offload = "nvme" does; here the
// "device" is host memory): the same bits as AdamW in place, parameters and both moments,
// over three steps, for the whole arena and a ZeRO shard. The sub-group size divides neither
// the chunks nor the parameters, so chunks are cut at sub-group boundaries mid-parameter and
// sub-groups hold pieces of several parameters; a moment read from the wrong offset, a
// chunk updated against another sub-group's buffer, or a sub-group not written back breaks
// the equality from step 2 on.
TEST_F(NvmeDir, AdamWWithMomentsOnNvmeThroughTheHostIsBitwiseTheStepInPlace) {
  OptimConfig cfg;
  const NvmeOptions nvme = options();
  for (int which = 0; which < 3; ++which) {
    const bool sharded = which > 0;
    SCOPED_TRACE(which == 0 ? "whole arena" : which == 1 ? "ZeRO shard" : "merged ZeRO shard");
    ParamStore plain = make_offload_params(), hosted = make_offload_params();
    const StateShard shard = which == 0   ? StateShard::whole(plain.numel())
                             : which == 1 ? some_rows(plain)
                                          : some_rows_reordered(plain);
    AdamW a(cfg, plain, shard), b(cfg, hosted, shard, &nvme, "adamw.state", false, true);
    EXPECT_TRUE(b.on_host());
    EXPECT_TRUE(b.offloaded());
    EXPECT_GT(b.host_staging_bytes(), 0u);
    ASSERT_GT(shard.numel, 3 * nvme.subgroup_elements) << "several sub-groups";
    for (int64_t step = 1; step <= 3; ++step) {
      const int64_t n = sharded ? shard.numel : plain.numel();
      std::vector<float> g = random_grads(n, uint32_t(step));
      const Tensor grads = view_of(g.data(), Shape{n});
      if (!sharded) {
        std::memcpy(plain.all_grads().data, g.data(), g.size() * sizeof(float));
        std::memcpy(hosted.all_grads().data, g.data(), g.size() * sizeof(float));
      }
      const float lr = 1e-3f * float(step);
      a.step(plain, lr, {}, false, sharded ? grads : Tensor{});
      b.step(hosted, lr, {}, false, sharded ? grads : Tensor{});
    }
    EXPECT_EQ(std::memcmp(plain.all_params().data, hosted.all_params().data, plain.bytes()), 0);
    std::vector<float> m(size_t(shard.numel)), v(size_t(shard.numel));
    b.read_state(0, 0, shard.numel, m.data());
    b.read_state(1, 0, shard.numel, v.data());
    const size_t state = size_t(shard.numel) * sizeof(float);
    EXPECT_EQ(std::memcmp(a.m_base(), m.data(), state), 0);
    EXPECT_EQ(std::memcmp(a.v_base(), v.data(), state), 0);
    const NvmeState::Stats io = b.nvme()->stats();
    // Each step reads and writes both moments whole (plus the reads above).
    EXPECT_GE(io.bytes_written, 3.0 * 2 * double(state));
    EXPECT_GE(io.bytes_read, 3.0 * 2 * double(state));
  }
}

// ZeRO-3's parameter shares on NVMe too (what a CUDA run with parallel.offload = "nvme" and
// parallel.offload_params does): the host update takes the parameters from the file's third
// tensor, only the gradients come down through the staging, and the new values go back to
// the file, not to the arena. Against AdamW in place: the file's parameters and moments
// bitwise equal to the in-place arena and moments after three steps, for a ZeRO shard and a
// merged one. The shard's values in the arena are overwritten with NaN after store_params():
// a step that read its parameters from the arena (or wrote them there) shows up as NaN in the
// file (or as a non-NaN in the arena). A background read (the unit fetch) brings the new
// values back.
TEST_F(NvmeDir, AdamWWithParametersOnNvmeThroughTheHostIsBitwiseTheStepInPlace) {
  OptimConfig cfg;
  const NvmeOptions nvme = options();
  for (int which = 1; which < 3; ++which) {
    SCOPED_TRACE(which == 1 ? "ZeRO shard" : "merged ZeRO shard");
    ParamStore plain = make_offload_params(), hosted = make_offload_params();
    const StateShard shard = which == 1 ? some_rows(plain) : some_rows_reordered(plain);
    AdamW a(cfg, plain, shard);
    AdamW b(cfg, hosted, shard, &nvme, "adamw.state", /*offload_params=*/true, /*on_host=*/true);
    AdamW moments_only(cfg, hosted, shard, &nvme, "moments.state", false, true);
    EXPECT_TRUE(b.on_host());
    EXPECT_TRUE(b.params_offloaded());
    EXPECT_EQ(b.nvme()->tensors(), 3);
    EXPECT_LT(b.host_staging_bytes(), moments_only.host_staging_bytes())
        << "only the gradients are staged";
    int asked = 0, holding = 0;  // only parameters holding some of the shard are asked for
    for (const ParamSpec& spec : hosted.specs()) holding += shard.pieces(spec).empty() ? 0 : 1;
    b.store_params(hosted, [&](int id, float* out) {
      const std::vector<float> values = hosted.to_host(id);
      std::copy(values.begin(), values.end(), out);
      ++asked;
    });
    EXPECT_EQ(asked, holding);
    b.reserve_param_uploads(shard.numel);  // host parameters: nothing to reserve
    EXPECT_EQ(b.host_staging_bytes() * 2, moments_only.host_staging_bytes());
    float* const arena = hosted.all_params().f32();
    for (const StateShard::Range& r : shard.ranges)
      std::fill(arena + r.begin, arena + r.end, std::numeric_limits<float>::quiet_NaN());
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g = random_grads(shard.numel, uint32_t(step));
      const Tensor grads = view_of(g.data(), Shape{shard.numel});
      const float lr = 1e-3f * float(step);
      a.step(plain, lr, {}, false, grads);
      b.step(hosted, lr, {}, false, grads);
    }
    const size_t state = size_t(shard.numel) * sizeof(float);
    std::vector<float> params(size_t(shard.numel)), m(size_t(shard.numel)), v(size_t(shard.numel));
    b.read_state(AdamW::kParamTensor, 0, shard.numel, params.data());
    b.read_state(0, 0, shard.numel, m.data());
    b.read_state(1, 0, shard.numel, v.data());
    std::vector<float> want(size_t(shard.numel));  // the in-place arena's shard, compact
    for (const StateShard::Range& r : shard.ranges)
      std::memcpy(want.data() + r.shard, plain.all_params().f32() + r.begin,
                  size_t(r.end - r.begin) * sizeof(float));
    EXPECT_EQ(std::memcmp(want.data(), params.data(), state), 0);
    EXPECT_EQ(std::memcmp(a.m_base(), m.data(), state), 0);
    EXPECT_EQ(std::memcmp(a.v_base(), v.data(), state), 0);
    int64_t written = 0;
    for (const StateShard::Range& r : shard.ranges)
      for (int64_t i = r.begin; i < r.end; ++i) written += std::isnan(arena[i]) ? 0 : 1;
    EXPECT_EQ(written, 0) << "the step wrote parameters into the arena";
    // The unit fetch: the last range's share back into the arena.
    const StateShard::Range& last = shard.ranges.back();
    const uint64_t read = b.start_param_read(last.shard, last.end - last.begin);
    b.finish_param_read(read, arena + last.begin);
    EXPECT_EQ(std::memcmp(arena + last.begin, plain.all_params().f32() + last.begin,
                          size_t(last.end - last.begin) * sizeof(float)),
              0);
  }
}

}  // namespace
}  // namespace pentad
