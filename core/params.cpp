#include "core/params.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/device_memory.h"
#include "core/rng.h"

namespace pentad {

int ParamStore::add(std::string name, Shape shape, Init init, float init_std, bool weight_decay) {
  return add_shard(std::move(name), shape, init, init_std, weight_decay, -1, 0, 0);
}

int ParamStore::add_shard(std::string name, Shape shape, Init init, float init_std,
                          bool weight_decay, int shard_dim, int64_t shard_start,
                          int64_t shard_len) {
  PENTAD_CHECK(find(name) < 0, "duplicate parameter {}", name);
  ParamSpec spec;
  spec.name = std::move(name);
  spec.global_shape = shape;
  spec.local_shape = shape;
  if (shard_dim >= 0) {
    PENTAD_CHECK(shard_dim < shape.ndim && shard_start >= 0 && shard_len > 0 &&
                     shard_start + shard_len <= shape[shard_dim],
                 "bad shard of {}", spec.name);
    spec.shard_dim = shard_dim;
    spec.shard_start = shard_start;
    spec.local_shape.dims[static_cast<size_t>(shard_dim)] = shard_len;
  }
  spec.init = init;
  spec.init_std = init_std;
  spec.weight_decay = weight_decay;
  // Align each parameter to 16 floats so every view starts on a cache line, and a large one
  // (256 KiB and up) to a page, so that a checkpoint can write it from where it lies with
  // direct I/O (checkpoint.snapshot = "swap"; the arenas start on pages too).
  const int64_t align = spec.local_shape.numel() >= kPageAlignedElements ? 1024 : 16;
  spec.offset = static_cast<size_t>((numel_ + align - 1) / align * align);
  numel_ = static_cast<int64_t>(spec.offset) + spec.local_shape.numel();
  specs_.push_back(std::move(spec));
  return static_cast<int>(specs_.size()) - 1;
}

int ParamStore::add_block(std::string name, Shape shape, Init init, float init_std,
                          bool weight_decay, int64_t start0, int64_t len0, int64_t start1,
                          int64_t len1) {
  PENTAD_CHECK(shape.ndim == 2 && start1 >= 0 && len1 > 0 && start1 + len1 <= shape[1],
               "bad block of {}: columns [{}, {}) of {}", name, start1, start1 + len1, shape.str());
  const int id = add_shard(std::move(name), shape, init, init_std, weight_decay, 0, start0, len0);
  ParamSpec& spec = specs_[static_cast<size_t>(id)];
  spec.shard_dim2 = 1;
  spec.shard_start2 = start1;
  spec.local_shape.dims[1] = len1;
  // Re-place it: the arena holds the block, not the rows.
  const int64_t align = spec.local_shape.numel() >= kPageAlignedElements ? 1024 : 16;
  numel_ = static_cast<int64_t>(spec.offset);
  spec.offset = static_cast<size_t>((numel_ + align - 1) / align * align);
  numel_ = static_cast<int64_t>(spec.offset) + spec.local_shape.numel();
  return id;
}

void ParamStore::allocate(Placement placement) {
  PENTAD_CHECK(placement.compute == DType::F32 || placement.compute == DType::BF16,
               "parameters compute in {}; want f32 or bf16", dtype_name(placement.compute));
  placement_ = placement;
  // Zeros without touching the pages (discard; one arena after the other, should a debug
  // poison have filled them): what a rank keeps resident is what it uses, so a ZeRO-3
  // rank's start-up does not peak at both whole arenas at once.
  params_ = placement.sparse_params ? Arena::reserved("parameters", bytes(), placement.device)
                                    : Arena("parameters", bytes(), placement.device);
  params_.discard(0, params_.capacity());
  grads_ = placement.sparse_grads ? Arena::reserved("gradients", bytes(), placement.device)
                                  : Arena("gradients", bytes(), placement.device);
  grads_.discard(0, grads_.capacity());
  param_at_.assign(specs_.size(), nullptr);
  grad_at_.assign(specs_.size(), nullptr);
  weight_at_.assign(specs_.size(), nullptr);
  // Sparse: a gathered unit's compute copy is a buffer of its own, like its values.
  if (placement.compute != DType::F32 && !placement.sparse_params) {
    weights_ =
        Arena("parameters (compute copy)",
              static_cast<size_t>(numel_) * dtype_bytes(placement.compute), placement.device);
    weights_.zero();
  }
}

void ParamStore::allocate_spare() {
  if (has_spare()) return;
  if (sparse_params()) {
    spare_ = Arena::reserved("parameters (spare set)", bytes(), device());
    for (const auto& [begin, end] : committed_)
      spare_.commit(size_t(begin) * sizeof(float), size_t(end) * sizeof(float));
    return;
  }
  spare_ = Arena("parameters (spare set)", bytes(), device());
  spare_.zero();
}

void ParamStore::commit_params(int64_t begin, int64_t end) {
  PENTAD_CHECK(sparse_params(), "commit_params: the parameter arena is not sparse");
  if (begin >= end) return;
  params_.commit(size_t(begin) * sizeof(float), size_t(end) * sizeof(float));
  if (has_spare()) spare_.commit(size_t(begin) * sizeof(float), size_t(end) * sizeof(float));
  committed_.emplace_back(begin, end);
}

Tensor ParamStore::param(int id) const {
  if (float* at = param_at_.empty() ? nullptr : param_at_[size_t(id)])
    return view_of(at, spec(id).local_shape, DType::F32, device());
  if (sparse_params()) homeless(id, "parameter");
  return view(params_.base(), id, device());
}

Tensor ParamStore::grad(int id) const {
  if (float* at = grad_at_.empty() ? nullptr : grad_at_[size_t(id)])
    return view_of(at, spec(id).local_shape, DType::F32, device());
  if (sparse_grads()) {
    for (const GradSource& source : grad_sources_)
      if (source(id)) return grad(id);
    homeless(id, "gradient");
  }
  return view(grads_.base(), id, device());
}

void ParamStore::homeless(int id, const char* what) const {
  fail(
      "ZeRO: the {} of {} was used outside its unit (sparse arenas hold only this rank's "
      "shares; a unit's values are there between its acquire and release, its gradients from "
      "backward to their reduction)",
      what, spec(id).name);
}

template <typename T>
void ParamStore::set_homes(std::vector<T*>& homes, int64_t begin, int64_t end, T* at,
                           size_t element) {
  for (size_t id = 0; id < specs_.size(); ++id) {
    const int64_t offset = int64_t(specs_[id].offset);
    if (offset >= begin && offset < end)
      homes[id] =
          at ? reinterpret_cast<T*>(reinterpret_cast<char*>(at) + size_t(offset - begin) * element)
             : nullptr;
  }
}

void ParamStore::place_params(int64_t begin, int64_t end, float* at, void* weights) {
  set_homes(param_at_, begin, end, at, sizeof(float));
  set_homes(weight_at_, begin, end, weights, dtype_bytes(placement_.compute));
}

void ParamStore::unplace_params(int64_t begin, int64_t end) {
  place_params(begin, end, nullptr, nullptr);
}

void ParamStore::place_grads(int64_t begin, int64_t end, float* at) {
  set_homes(grad_at_, begin, end, at, sizeof(float));
}

void ParamStore::unplace_grads(int64_t begin, int64_t end) {
  place_grads(begin, end, nullptr);
}

Tensor ParamStore::spare_params() const {
  PENTAD_CHECK(has_spare(), "the parameters have no spare set (allocate_spare)");
  return view_of(spare_.base(), Shape{numel_}, DType::F32, device());
}

void ParamStore::swap_params() {
  PENTAD_CHECK(has_spare(), "the parameters have no spare set (allocate_spare)");
  std::swap(params_, spare_);
}

Tensor ParamStore::compute_copy() const {
  if (!weights_.base()) return {};
  Tensor t = all_params();
  t.data = weights_.base();
  t.dtype = placement_.compute;
  return t;
}

Tensor ParamStore::weight(int id) const {
  if (placement_.compute == DType::F32) return param(id);
  if (void* at = weight_at_.empty() ? nullptr : weight_at_[size_t(id)]) {
    Tensor t = param(id);
    t.data = at;
    t.dtype = placement_.compute;
    return t;
  }
  if (sparse_params()) homeless(id, "compute copy");
  Tensor t = param(id);
  t.data = static_cast<char*>(weights_.base()) + spec(id).offset * dtype_bytes(placement_.compute);
  t.dtype = placement_.compute;
  return t;
}

std::vector<float> ParamStore::to_host(int id) const {
  std::vector<float> out(static_cast<size_t>(spec(id).local_shape.numel()));
  copy_bytes(out.data(), Device::CPU, param(id).data, device(), out.size() * sizeof(float));
  return out;
}

void ParamStore::initialize(uint64_t seed) {
  // Device parameters, and those of a sparse arena, are drawn into host memory and copied
  // over (a sparse arena: only what it backs).
  const bool in_place = device() == Device::CPU && !sparse_params();
  std::vector<float> host;
  for (int id = 0; id < static_cast<int>(specs_.size()); ++id) {
    const ParamSpec& spec = specs_[static_cast<size_t>(id)];
    const int64_t n = spec.local_shape.numel();
    const int64_t begin = int64_t(spec.offset);
    auto backs = [&](const std::pair<int64_t, int64_t>& r) {
      return std::max(r.first, begin) < std::min(r.second, begin + n);
    };
    // A sparse arena backing none of it (ZeRO-3: another rank's shares, or all of them kept
    // in the optimizer's file): nothing to draw.
    if (sparse_params() && std::none_of(committed_.begin(), committed_.end(), backs)) continue;
    host.resize(in_place ? 0 : size_t(n));
    float* const p = in_place ? param(id).f32() : host.data();
    draw(spec, seed, p);
    if (in_place) continue;
    float* const arena = static_cast<float*>(params_.base());
    if (!sparse_params()) {
      copy_bytes(arena + begin, device(), p, Device::CPU, size_t(n) * sizeof(float));
      continue;
    }
    for (const auto& [lo, hi] : committed_) {
      const int64_t from = std::max(lo, begin), to = std::min(hi, begin + n);
      if (from < to)
        copy_bytes(arena + from, device(), p + (from - begin), Device::CPU,
                   size_t(to - from) * sizeof(float));
    }
  }
}

void ParamStore::draw(const ParamSpec& spec, uint64_t seed, float* p) {
  const int64_t n = spec.local_shape.numel();
  if (spec.init != Init::Normal) {
    const float value = spec.init == Init::Ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) p[i] = value;
    return;
  }
  const uint64_t key = splitmix64(seed) ^ hash_string(spec.name);
  // Map local element i to its global flat index (row-major) through the shard.
  int64_t inner = 1;  // elements per step along shard_dim
  for (int d = spec.shard_dim + 1; d < spec.global_shape.ndim; ++d) inner *= spec.global_shape[d];
  const int64_t local_dim = spec.shard_dim >= 0 ? spec.local_shape[spec.shard_dim] : 1;
  const int64_t global_dim = spec.shard_dim >= 0 ? spec.global_shape[spec.shard_dim] : 1;
  if (spec.shard_dim2 >= 0) {  // a 2D block of a matrix: (rows, cols) at (start, start2)
    const int64_t cols = spec.local_shape[1], global_cols = spec.global_shape[1];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t global =
          (spec.shard_start + i / cols) * global_cols + spec.shard_start2 + i % cols;
      p[i] = static_cast<float>(spec.init_std * normal_at(key, static_cast<uint64_t>(global)));
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    int64_t global = i;
    if (spec.shard_dim >= 0) {
      const int64_t outer = i / (local_dim * inner);
      const int64_t along = (i / inner) % local_dim;
      global = (outer * global_dim + spec.shard_start + along) * inner + i % inner;
    }
    p[i] = static_cast<float>(spec.init_std * normal_at(key, static_cast<uint64_t>(global)));
  }
}

Tensor ParamStore::view(void* base, int id, Device device) const {
  const ParamSpec& spec = specs_[static_cast<size_t>(id)];
  return view_of(static_cast<float*>(base) + spec.offset, spec.local_shape, DType::F32, device);
}

Tensor ParamStore::all_params() const {
  return view_of(params_.base(), Shape{numel_}, DType::F32, device());
}

Tensor ParamStore::all_grads() const {
  return view_of(grads_.base(), Shape{numel_}, DType::F32, device());
}

void ParamStore::zero_grads() {
  if (!grads_.base()) return;
  if (device() == Device::CPU)
    std::memset(grads_.base(), 0, bytes());
  else
    device_zero(grads_.base(), bytes());
}

int ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<StateShard::Piece> StateShard::pieces(const ParamSpec& spec) const {
  const int64_t begin = int64_t(spec.offset), n = spec.local_shape.numel();
  const int64_t row =
      spec.local_shape.ndim > 0 && spec.local_shape[0] > 0 ? n / spec.local_shape[0] : 1;
  std::vector<Piece> out;
  for (const Range& r : ranges) {
    const int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, begin + n);
    if (lo >= hi) continue;
    PENTAD_CHECK((lo - begin) % row == 0 && (hi - begin) % row == 0,
                 "{}: shard range [{}, {}) does not fall on its rows of {} elements", spec.name, lo,
                 hi, row);
    out.push_back({lo, r.shard + (lo - r.begin), hi - lo, (lo - begin) / row, (hi - lo) / row});
  }
  return out;
}

StateShard StateShard::merge(const StateShard& a, const StateShard& b) {
  StateShard out{a.ranges, a.numel + b.numel};
  for (Range r : b.ranges) {
    r.shard += a.numel;
    out.ranges.push_back(r);
  }
  std::sort(out.ranges.begin(), out.ranges.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < out.ranges.size(); ++i)
    PENTAD_CHECK(out.ranges[i - 1].end <= out.ranges[i].begin,
                 "StateShard::merge: the shards overlap at arena element {}", out.ranges[i].begin);
  return out;
}

}  // namespace pentad
