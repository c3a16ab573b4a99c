#pragma once
// Boxes: axis-aligned regions [start, start + count) of a tensor of up to kMaxDims dims.
// A shard is a box of its global tensor; resharding on load is intersecting the box a rank
// wants with the boxes stored, and copying each overlap from one row-major buffer into
// another. Internal to checkpoint/.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace pentad::ckpt {

struct Box {
  int ndim = 0;
  std::array<int64_t, kMaxDims> start{}, count{};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= count[static_cast<size_t>(d)];
    return n;
  }
  int64_t begin(int d) const { return start[static_cast<size_t>(d)]; }
  int64_t end(int d) const { return start[static_cast<size_t>(d)] + count[static_cast<size_t>(d)]; }
  int64_t extent(int d) const { return count[static_cast<size_t>(d)]; }
  bool operator==(const Box& other) const = default;
};

// The box of global tensor `global` that a shard split along shard_dim (-1: none) holds
// (and along shard_dim2 too, from shard_start2: a 2D tensor-parallel block), and of that
// slice, `local[0]` rows from row_start on along dim 0 (a ZeRO share; the whole slice when
// local[0] is its length).
inline Box shard_box(const Shape& global, int shard_dim, int64_t shard_start, const Shape& local,
                     int64_t row_start = 0, int shard_dim2 = -1, int64_t shard_start2 = 0) {
  Box b;
  b.ndim = global.ndim;
  for (int d = 0; d < global.ndim; ++d) {
    b.start[static_cast<size_t>(d)] = (d == shard_dim ? shard_start : 0) +
                                      (d == shard_dim2 ? shard_start2 : 0) +
                                      (d == 0 ? row_start : 0);
    b.count[static_cast<size_t>(d)] = local[d];
  }
  return b;
}

inline Box whole_box(const Shape& shape) {
  return shard_box(shape, -1, 0, shape, 0);
}

inline Box intersect(const Box& a, const Box& b) {
  Box o;
  o.ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    const int64_t lo = std::max(a.begin(d), b.begin(d)), hi = std::min(a.end(d), b.end(d));
    o.start[static_cast<size_t>(d)] = lo;
    o.count[static_cast<size_t>(d)] = std::max<int64_t>(0, hi - lo);
  }
  return o;
}

// `inner` expressed relative to `outer`'s origin.
inline Box relative_to(const Box& inner, const Box& outer) {
  Box r = inner;
  for (int d = 0; d < inner.ndim; ++d) r.start[static_cast<size_t>(d)] -= outer.begin(d);
  return r;
}

// a minus b as disjoint boxes (at most 2 per dim).
inline std::vector<Box> subtract(const Box& a, const Box& b) {
  const Box o = intersect(a, b);
  if (o.numel() == 0) return {a};
  std::vector<Box> parts;
  Box rest = a;  // shrinks to the overlap one dim at a time
  for (int d = 0; d < a.ndim; ++d) {
    const auto du = static_cast<size_t>(d);
    if (o.begin(d) > rest.begin(d)) {
      Box below = rest;
      below.count[du] = o.begin(d) - rest.begin(d);
      parts.push_back(below);
    }
    if (o.end(d) < rest.end(d)) {
      Box above = rest;
      above.start[du] = o.end(d);
      above.count[du] = rest.end(d) - o.end(d);
      parts.push_back(above);
    }
    rest.start[du] = o.begin(d);
    rest.count[du] = o.extent(d);
  }
  return parts;
}

// Whether box b of a row-major buffer with shape `outer` is one contiguous run: full extent
// in every dim after the first one it does not span fully, extent 1 in every dim before.
inline bool contiguous_in(const Box& b, const Box& outer) {
  int d = outer.ndim - 1;
  while (d >= 0 && b.extent(d) == outer.extent(d)) --d;
  for (int e = 0; e < d; ++e)
    if (b.extent(e) != 1) return false;
  return true;
}

// Row-major element offset of b's first element inside a buffer with shape `outer` (b given
// relative to outer's origin).
inline int64_t offset_in(const Box& b, const Box& outer) {
  int64_t offset = 0;
  for (int d = 0; d < outer.ndim; ++d) offset = offset * outer.extent(d) + b.begin(d);
  return offset;
}

// Copies region (relative to src_box) of a row-major src buffer holding src_box into the
// row-major dst buffer holding dst_box; `region` is in global coordinates.
inline void copy_region(const float* src, const Box& src_box, float* dst, const Box& dst_box,
                        const Box& region) {
  // Pad to 4 dims with leading extent-1 dims so that one loop nest serves every rank.
  constexpr int n = kMaxDims;
  std::array<int64_t, n> count{}, src_ext{}, dst_ext{}, src_at{}, dst_at{};
  const int pad = n - region.ndim;
  for (int d = 0; d < n; ++d) {
    const auto du = static_cast<size_t>(d);
    const int g = d - pad;
    count[du] = g < 0 ? 1 : region.extent(g);
    src_ext[du] = g < 0 ? 1 : src_box.extent(g);
    dst_ext[du] = g < 0 ? 1 : dst_box.extent(g);
    src_at[du] = g < 0 ? 0 : region.begin(g) - src_box.begin(g);
    dst_at[du] = g < 0 ? 0 : region.begin(g) - dst_box.begin(g);
  }
  const size_t run_bytes = static_cast<size_t>(count[3]) * sizeof(float);
  for (int64_t i0 = 0; i0 < count[0]; ++i0)
    for (int64_t i1 = 0; i1 < count[1]; ++i1)
      for (int64_t i2 = 0; i2 < count[2]; ++i2) {
        const int64_t s =
            (((src_at[0] + i0) * src_ext[1] + src_at[1] + i1) * src_ext[2] + src_at[2] + i2) *
                src_ext[3] +
            src_at[3];
        const int64_t t =
            (((dst_at[0] + i0) * dst_ext[1] + dst_at[1] + i1) * dst_ext[2] + dst_at[2] + i2) *
                dst_ext[3] +
            dst_at[3];
        std::memcpy(dst + t, src + s, run_bytes);
      }
}

// "rows [a, b) along dim d" for a part of `global` that nothing covers.
inline std::string describe_gap(const Box& gap, const Shape& global) {
  for (int d = 0; d < gap.ndim; ++d)
    if (gap.extent(d) != global[d])
      return fmt::format("rows [{}, {}) along dim {}", gap.begin(d), gap.end(d), d);
  return gap.ndim == 0 ? "its only element" : fmt::format("rows [0, {}) along dim 0", global[0]);
}

}  // namespace pentad::ckpt
