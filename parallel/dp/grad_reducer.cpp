#include "parallel/dp/grad_reducer.h"

#include <algorithm>
#include <utility>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace pentad::parallel {

GradReducer::GradReducer(Communicator& group, ParamStore& params, size_t bucket_bytes,
                         int zero_stage, const Filter& include, const Filter& isolate,
                         const Unit& unit, FetchShare fetch)
    : group_(group),
      params_(params),
      stage_(zero_stage),
      device_(params.device()),
      fetch_(std::move(fetch)) {
  PENTAD_CHECK(!fetch_ || stage_ == 3, "only ZeRO-3 keeps the parameter shares outside the arena");
  const auto& specs = params.specs();
  const int64_t bucket_elems =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  int64_t end = params.numel(), begin = end;  // the open bucket
  auto close = [&] {
    if (begin < end) {
      buckets_.emplace_back();
      buckets_.back().begin = begin;
      buckets_.back().end = end;
    }
    end = begin;
  };
  std::string open_unit;
  for (size_t i = specs.size(); i-- > 0;) {
    const int64_t offset = static_cast<int64_t>(specs[i].offset);
    if (include && !include(specs[i])) {  // closes the open bucket below the one left out
      close();
      end = begin = offset;
      continue;
    }
    if (unit) {  // never two keys in a bucket; at stage 3 whole units, whatever their size
      const std::string key = unit(specs[i]);
      if (key != open_unit) close();
      open_unit = key;
      if (stage_ == 3) {
        begin = offset;
        continue;
      }
    }
    const bool alone = isolate && isolate(specs[i]);
    if (alone) close();
    begin = offset;
    if (alone || end - begin >= bucket_elems) close();
  }
  close();
  last_ = buckets_.size();
  if (stage_ == 0) return;
  // The compact buffer holds this rank's shares in arena order.
  for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
    cut_shares(*b, params);
    const int64_t at = share_begin(*b);
    const int64_t mine = b->counts[size_t(group_.rank())];
    b->shard = shard_.numel;
    if (mine > 0) shard_.ranges.push_back({at, at + mine, shard_.numel});
    shard_.numel += mine;
  }
  shard_grads_ = Arena("reduced gradient shares", size_t(shard_.numel) * sizeof(float), device_);
  // Zeros by discarding: the pages come when the first reduction writes them, not while
  // the whole parameter arena is still resident at start-up (ZeRO-3's peak).
  shard_grads_.discard(0, shard_grads_.capacity());
  shares_ = static_cast<float*>(shard_grads_.base());
  PENTAD_CHECK(params.sparse_grads() == (stage_ >= 2) && params.sparse_params() == (stage_ == 3),
               "ZeRO-{} wants a parameter store with {} (Placement::sparse_*)", stage_,
               stage_ == 3   ? "sparse parameters and gradients"
               : stage_ == 2 ? "sparse gradients only"
                             : "no sparse arena");
  if (stage_ >= 2) params.add_grad_source([this](int id) { return grads_source(id); });
  if (stage_ < 3) return;
  if (!fetch_)  // the arena backs this rank's shares only (kept elsewhere: nothing)
    for (const StateShard::Range& r : shard_.ranges) params.commit_params(r.begin, r.end);
  for (Bucket& b : buckets_) b.whole = false;  // no unit is gathered yet
}

GradReducer::~GradReducer() {
  for (Bucket& b : buckets_) {
    b.work = Work();  // assigning waits for the operation replaced
    b.gather = Work();
    if (b.arrival) {
      try {
        b.arrival();
      } catch (const std::exception&) {  // reported where it failed; nothing to add here
      }
    }
  }
}

void GradReducer::cut_shares(Bucket& b, const ParamStore& params) const {
  // Cut k of D aims at begin + k (end - begin) / D and moves to the nearest row boundary of
  // the parameter it falls in (a gap between parameters is a boundary everywhere).
  const int D = group_.size();
  std::vector<int64_t> cuts = {b.begin};
  for (int k = 1; k < D; ++k) {
    int64_t t = b.begin + (b.end - b.begin) * k / D;
    for (const ParamSpec& spec : params.specs()) {
      const int64_t o = int64_t(spec.offset), n = spec.local_shape.numel();
      if (t <= o || t >= o + n) continue;
      const int64_t row = spec.local_shape[0] > 0 ? n / spec.local_shape[0] : n;
      const int64_t lo = o + (t - o) / row * row;
      t = t - lo <= lo + row - t ? lo : lo + row;
      break;
    }
    cuts.push_back(std::max(t, cuts.back()));
  }
  cuts.push_back(b.end);
  b.counts.resize(size_t(D));
  for (int r = 0; r < D; ++r) b.counts[size_t(r)] = cuts[size_t(r) + 1] - cuts[size_t(r)];
}

Tensor GradReducer::shard_grads() const {
  return view_of(shares_, Shape{shard_.numel}, DType::F32, device_);
}

void GradReducer::place_shares(const Tensor& buffer) {
  PENTAD_CHECK(stage_ > 0 && buffer.numel() == shard_.numel && buffer.dtype == DType::F32 &&
                   buffer.device == device_,
               "place_shares: want {} F32 elements on the gradients' device for the ZeRO-{} "
               "shares, got {}",
               shard_.numel, stage_, buffer.shape.str());
  copy(buffer, shard_grads());
  shares_ = buffer.f32();
  shard_grads_ = Arena();
}

Arena GradReducer::take(size_t bytes, const char* what) {
  // The buffer that the same take of the step before had (the n-th since finish()), if
  // free: a step's takes and gives come in the order of the one before, so by induction over
  // its takes each finds that buffer free and the pool makes none. Otherwise (the first step,
  // or after a pass of another shape: an evaluation) the smallest that fits, or a new one.
  const size_t nth = takes_++;
  size_t pick = pool_.size();
  if (nth < took_.size())
    for (size_t i = 0; i < pool_.size() && pick == pool_.size(); ++i)
      if (pool_[i].base() == took_[nth] && pool_[i].capacity() >= bytes) pick = i;
  if (pick == pool_.size())
    for (size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].capacity() >= bytes &&
          (pick == pool_.size() || pool_[i].capacity() < pool_[pick].capacity()))
        pick = i;
  Arena buffer;
  if (pick < pool_.size()) {
    buffer = std::move(pool_[pick]);
    pool_.erase(pool_.begin() + std::ptrdiff_t(pick));
  } else {
    buffer = make_buffer(bytes, what);
  }
  if (took_.size() <= nth) took_.resize(nth + 1);
  took_[nth] = buffer.base();
  return buffer;
}

Arena GradReducer::make_buffer(size_t bytes, const char* what) {
  ++buffers_made_;
  const std::string name = fmt::format("ZeRO unit {}", what);
  if (device_ != Device::CPU) return Arena(name, bytes, device_);
  // On the host fresh pages of their own, in memory once written (heap memory might be
  // pages an earlier free left resident), given back by give()'s discard.
  Arena buffer = Arena::reserved(name, bytes);
  buffer.commit(0, buffer.capacity());
  buffer.prefer_huge_pages();  // refilled after every discard: 512 times fewer faults
  return buffer;
}

void GradReducer::give(Arena& buffer) {
  if (!buffer.base()) return;
  // The host's pages go back to the system; device memory stays for the next unit.
  if (device_ == Device::CPU) buffer.discard(0, buffer.capacity());
  pool_.push_back(std::move(buffer));
}

size_t GradReducer::pool_bytes() const {
  size_t total = 0;
  for (const Arena& a : pool_) total += a.capacity();
  for (const Bucket& b : buckets_)
    total += b.values.capacity() + b.compute.capacity() + b.grads.capacity();
  return total;
}

void GradReducer::home_grads(Bucket& b) {
  if (b.grads.base()) return;
  b.grads = take(size_t(b.end - b.begin) * sizeof(float), "gradients");
  b.grads.discard(0, b.grads.capacity());  // zeros
  params_.place_grads(b.begin, b.end, static_cast<float*>(b.grads.base()));
}

void GradReducer::drop_grads(Bucket& b) {
  if (!b.grads.base()) return;
  params_.unplace_grads(b.begin, b.end);
  give(b.grads);
}

bool GradReducer::grads_source(int id) {
  const int bucket = bucket_of(int64_t(params_.spec(id).offset));
  if (bucket < 0) return false;
  PENTAD_CHECK(size_t(bucket) < first_ || size_t(bucket) >= next_,
               "the gradient of {} was written after its bucket's reduction began (backward "
               "reported it final too early)",
               params_.spec(id).name);
  home_grads(buckets_[size_t(bucket)]);
  return true;
}

void GradReducer::drop_gathered_grads() {
  for (Bucket& b : buckets_) drop_grads(b);
}

void GradReducer::start(Bucket& b) {
  if (stage_ >= 2) home_grads(b);  // a bucket backward never wrote sends zeros
  const Tensor region = view_of(
      stage_ >= 2 ? static_cast<float*>(b.grads.base()) : params_.all_grads().f32() + b.begin,
      Shape{b.end - b.begin}, DType::F32, device_);
  if (stage_ == 0) {
    b.work = group_.all_reduce(region, ReduceOp::Sum, /*async=*/true);
    return;
  }
  const int64_t mine = b.counts[size_t(group_.rank())];
  const Tensor share = view_of(shares_ + b.shard, Shape{mine}, DType::F32, device_);
  if (stage_ >= 2 && b.summed && mine > 0) {
    // Stage 2's later micro-batches: the sum so far joins this rank's part of the bucket
    // before the reduce-scatter, which then leaves sum so far + this micro-batch's in the
    // shares. No second buffer of shares to receive into; on CUDA the add is queued on the
    // compute stream, which the collective's stream follows.
    const Tensor part =
        view_of(region.f32() + (share_begin(b) - b.begin), Shape{mine}, DType::F32, device_);
    kernels::add(part, part, share);
  }
  b.work = group_.reduce_scatter_v(share, region, b.counts, ReduceOp::Sum, /*async=*/true);
  b.summed = true;
}

void GradReducer::report(Bucket& b) {
  if (b.reported) return;
  b.reported = true;
  const int64_t mine = stage_ == 0 ? 0 : b.counts[size_t(group_.rank())];
  if (reduced_ && stage_ == 0) reduced_(b.begin, b.end - b.begin);
  if (reduced_ && mine > 0) reduced_(b.shard, mine);
}

void GradReducer::complete(Bucket& b) {
  if (b.done) return;
  report(b);
  b.done = true;
  if (stage_ >= 2) drop_grads(b);
}

void GradReducer::begin_step() {
  for (Bucket& b : buckets_) b.summed = false;
  takes_ = 0;
}

void GradReducer::set_window(int64_t begin, int64_t end) {
  PENTAD_CHECK(next_ == first_, "set_window: the last window's buckets are not finished");
  size_t first = 0;
  while (first < buckets_.size() && buckets_[first].begin >= end) ++first;
  size_t last = first;
  while (last < buckets_.size() && buckets_[last].begin >= begin) ++last;
  const bool cut = (first < last && buckets_[first].end > end) ||
                   (last < buckets_.size() && buckets_[last].end > begin);
  PENTAD_CHECK(!cut, "set_window: [{}, {}) cuts a bucket", begin, end);
  first_ = next_ = first;
  last_ = last;
  windowed_ = true;
}

void GradReducer::clear_window() {
  PENTAD_CHECK(next_ == first_, "clear_window: the window's buckets are not finished");
  first_ = next_ = 0;
  last_ = buckets_.size();
  windowed_ = false;
}

void GradReducer::ready_from(int64_t offset) {
  while (next_ < last_ && buckets_[next_].begin >= offset) {
    Bucket& b = buckets_[next_++];
    b.done = b.reported = false;
    if (&b == &buckets_.front() && bug_injected("dp-skip-last-bucket")) continue;
    start(b);
  }
  // Drive progress, and report what is done. Stage 2 gives a bucket's gradient buffer back
  // to the pool only below, at points every step reaches alike (not when a test happens to
  // find its reduction done), so that the pool's takes and gives run in the same order in
  // every step and the pool, settled in the first, makes no buffer after it.
  for (size_t i = first_; i < next_; ++i)
    if (buckets_[i].work.test()) stage_ >= 2 ? report(buckets_[i]) : complete(buckets_[i]);
  if (stage_ < 2) return;
  // Stage 2 holds at most kInFlight buckets of full-size gradients: MPI without a progress
  // thread moves a reduction only inside MPI calls, so without this bound buckets finish
  // (and free their pages) many layers late (bench/RESULTS.md, ZeRO memory).
  size_t pending = 0;
  for (size_t i = first_; i < next_; ++i) pending += buckets_[i].done ? 0 : 1;
  for (size_t i = first_; i < next_ && pending > kInFlight; ++i)
    if (!buckets_[i].done) {
      buckets_[i].work.wait();
      complete(buckets_[i]);
      --pending;
    }
}

void GradReducer::finish() {
  ready_from(0);
  for (size_t i = first_; i < last_; ++i) {
    buckets_[i].work.wait();
    complete(buckets_[i]);
  }
  next_ = first_;
  if (!windowed_) takes_ = 0;  // the pool's takes of the next step count from here
}

void GradReducer::gather(const std::function<float*(Bucket&)>& at) {
  for (Bucket& b : buckets_)
    if (&b != &buckets_.front() || !bug_injected("zero-skip-gather"))  // planted for tests
      b.work = group_.all_gather_v(view_of(at(b), Shape{b.end - b.begin}, DType::F32, device_),
                                   b.counts, /*async=*/true);
  for (Bucket& b : buckets_) b.work.wait();
}

void GradReducer::gather_params() {
  float* const arena = params_.all_params().f32();
  if (stage_ == 1 || stage_ == 2) gather([arena](Bucket& b) { return arena + b.begin; });
}

int64_t GradReducer::largest_bucket() const {
  int64_t most = 0;
  for (const Bucket& b : buckets_) most = std::max(most, b.end - b.begin);
  return most;
}

int64_t GradReducer::bucket_elements(int b) const {
  const Bucket& bucket = buckets_.at(size_t(b));
  return bucket.end - bucket.begin;
}

int64_t GradReducer::bucket_share(int b) const {
  const Bucket& bucket = buckets_.at(size_t(b));
  return bucket.counts.empty() ? bucket.end - bucket.begin : bucket.counts[size_t(group_.rank())];
}

int GradReducer::units_whole() const {
  if (stage_ < 3) return 0;
  return int(
      std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.whole; }));
}

int GradReducer::bucket_of(int64_t offset) const {
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].begin <= offset && offset < buckets_[i].end) return int(i);
  return -1;
}

int64_t GradReducer::share_begin(const Bucket& b) const {
  int64_t at = b.begin;
  for (int r = 0; r < group_.rank(); ++r) at += b.counts[size_t(r)];
  return at;
}

void GradReducer::read_ahead(int bucket) {
  if (!fetch_ || bucket < 0 || bucket >= int(buckets_.size())) return;
  Bucket& b = buckets_[size_t(bucket)];
  const int64_t mine = b.counts[size_t(group_.rank())];
  if (b.whole || b.arrival || mine == 0) return;  // whole, gathering, or reading already
  b.arrival = fetch_(b.shard, mine, values_at(b) + (share_begin(b) - b.begin));
}

float* GradReducer::values_at(Bucket& b) {
  if (!b.values.base()) b.values = take(size_t(b.end - b.begin) * sizeof(float), "parameters");
  return static_cast<float*>(b.values.base());
}

void GradReducer::prefetch(int bucket) {
  if (bucket < 0 || bucket >= int(buckets_.size())) return;
  Bucket& b = buckets_[size_t(bucket)];
  if (b.whole) return;  // whole, or on its way
  float* const at = values_at(b);
  if (fetch_) {  // the all-gather sends this rank's share from where it lies: it must be there
    read_ahead(bucket);
    if (b.arrival) std::exchange(b.arrival, {})();
  } else {  // this rank's share, from the arena into the gather's buffer
    const int64_t from = share_begin(b), mine = b.counts[size_t(group_.rank())];
    copy(view_of(at + (from - b.begin), Shape{mine}, DType::F32, device_),
         view_of(params_.all_params().f32() + from, Shape{mine}, DType::F32, device_));
  }
  b.gather = group_.all_gather_v(view_of(at, Shape{b.end - b.begin}, DType::F32, device_), b.counts,
                                 /*async=*/true);
  b.whole = true;  // once the gather is waited for
  b.fresh = false;
  params_.place_params(b.begin, b.end, at, b.compute.base());  // bf16: with acquire()'s copy
}

void GradReducer::acquire(int bucket) {
  Bucket& b = buckets_[size_t(bucket)];
  prefetch(bucket);
  b.gather.wait();  // on CUDA: the compute stream waits for the gather, the host does not
  if (!b.fresh) refresh_compute_copy(b);
  ++b.users;
}

void GradReducer::refresh_compute_copy(Bucket& b) {
  b.fresh = true;
  const DType type = params_.compute_dtype();
  if (type == DType::F32) return;  // the model computes from the fp32 values themselves
  const int64_t n = b.end - b.begin;
  if (!b.compute.base()) b.compute = take(size_t(n) * dtype_bytes(type), "compute copy");
  params_.place_params(b.begin, b.end, values_at(b), b.compute.base());
  kernels::convert(view_of(b.compute.base(), Shape{n}, type, device_),
                   view_of(values_at(b), Shape{n}, DType::F32, device_));
}

void GradReducer::release(int bucket) {
  Bucket& b = buckets_[size_t(bucket)];
  PENTAD_CHECK(b.users > 0, "bucket {} released more often than acquired", bucket);
  if (--b.users > 0) return;
  b.gather.wait();
  // The arena holds this rank's share (or, kept elsewhere, none of it) and nothing else.
  params_.unplace_params(b.begin, b.end);
  give(b.values);
  give(b.compute);
  b.whole = false;
}

void GradReducer::release_all() {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    // A read ahead of a unit never acquired (a step ends) lands before its pages go.
    if (buckets_[i].arrival) std::exchange(buckets_[i].arrival, {})();
    buckets_[i].users = 1;
    buckets_[i].whole = true;
    release(int(i));
  }
}

void GradReducer::gather_grads() {
  if (stage_ == 0) return;
  float* const arena = params_.all_grads().f32();
  auto at = [&](Bucket& b) {
    if (stage_ < 2) return arena + b.begin;
    home_grads(b);
    return static_cast<float*>(b.grads.base());
  };
  for (Bucket& b : buckets_) {
    const int64_t mine = b.counts[size_t(group_.rank())];
    copy(view_of(at(b) + (share_begin(b) - b.begin), Shape{mine}, DType::F32, device_),
         view_of(shares_ + b.shard, Shape{mine}, DType::F32, device_));
  }
  gather(at);
}

}  // namespace pentad::parallel
