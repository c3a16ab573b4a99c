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

void ParamStore::allocate(Placement placement) {
  PENTAD_CHECK(placement.compute == DType::F32 || placement.compute == DType::BF16,
               "parameters compute in {}; want f32 or bf16", dtype_name(placement.compute));
  placement_ = placement;
  // Zeros without touching the pages (discard; one arena after the other, should a debug
  // poison have filled them): what a rank keeps resident is what it uses, so a ZeRO-3
  // rank's start-up does not peak at both whole arenas at once.
  params_ = Arena("parameters", bytes(), placement.device);
  params_.discard(0, params_.capacity());
  grads_ = Arena("gradients", bytes(), placement.device);
  grads_.discard(0, grads_.capacity());
  if (placement.compute != DType::F32) {
    weights_ =
        Arena("parameters (compute copy)",
              static_cast<size_t>(numel_) * dtype_bytes(placement.compute), placement.device);
    weights_.zero();
  }
}

void ParamStore::allocate_spare() {
  if (has_spare()) return;
  spare_ = Arena("parameters (spare set)", bytes(), device());
  spare_.zero();
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
  if (!weights_.base()) return param(id);
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
  // Device parameters are drawn into host memory and copied over.
  std::vector<float> host(device() == Device::CPU ? 0 : static_cast<size_t>(numel_));
  for (int id = 0; id < static_cast<int>(specs_.size()); ++id) {
    const ParamSpec& spec = specs_[static_cast<size_t>(id)];
    float* p = device() == Device::CPU ? param(id).f32() : host.data() + spec.offset;
    int64_t n = spec.local_shape.numel();
    if (spec.init != Init::Normal) {
      float value = spec.init == Init::Ones ? 1.0f : 0.0f;
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      continue;
    }
    uint64_t key = splitmix64(seed) ^ hash_string(spec.name);
    // Map local element i to its global flat index (row-major) through the shard.
    int64_t inner = 1;  // elements per step along shard_dim
    for (int d = spec.shard_dim + 1; d < spec.global_shape.ndim; ++d) inner *= spec.global_shape[d];
    int64_t local_dim = spec.shard_dim >= 0 ? spec.local_shape[spec.shard_dim] : 1;
    int64_t global_dim = spec.shard_dim >= 0 ? spec.global_shape[spec.shard_dim] : 1;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      int64_t global = i;
      if (spec.shard_dim >= 0) {
        int64_t outer = i / (local_dim * inner);
        int64_t along = (i / inner) % local_dim;
        global = (outer * global_dim + spec.shard_start + along) * inner + i % inner;
      }
      p[i] = static_cast<float>(spec.init_std * normal_at(key, static_cast<uint64_t>(global)));
    }
  }
  if (device() != Device::CPU)
    copy_bytes(params_.base(), device(), host.data(), Device::CPU, bytes());
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
