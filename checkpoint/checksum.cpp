#include "checkpoint/checksum.h"

// Compiled here, with this build's CPU flags, xxh3 uses the machine's vector units (Debian's
// shared library is built for baseline x86-64). GCC 12 warns falsely inside its own
// AVX-512 intrinsics, which xxhash.h then uses.
#define XXH_INLINE_ALL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <xxhash.h>
#pragma GCC diagnostic pop
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

#include "core/check.h"

namespace pentad::ckpt {

namespace {

uint32_t crc32_of(const void* data, size_t size, bool parallel) {
  const auto* bytes = static_cast<const Bytef*>(data);
  constexpr size_t kPiece = size_t{8} << 20;  // crc32_combine costs ~ a few µs
  const int pieces =
      parallel ? static_cast<int>(std::min<size_t>((size + kPiece - 1) / kPiece, 1024)) : 1;
  if (pieces <= 1) return static_cast<uint32_t>(crc32_z(0L, bytes, size));
  std::vector<uLong> crcs(static_cast<size_t>(pieces));
  const size_t step = (size + static_cast<size_t>(pieces) - 1) / static_cast<size_t>(pieces);
#pragma omp parallel for schedule(static)
  for (int p = 0; p < pieces; ++p) {
    const size_t at = std::min(size, static_cast<size_t>(p) * step);
    crcs[static_cast<size_t>(p)] = crc32_z(0L, bytes + at, std::min(step, size - at));
  }
  uLong crc = crcs[0];
  for (int p = 1; p < pieces; ++p) {
    const size_t at = std::min(size, static_cast<size_t>(p) * step);
    crc = crc32_combine(crc, crcs[static_cast<size_t>(p)],
                        static_cast<z_off_t>(std::min(step, size - at)));
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

const char* checksum_name(ChecksumKind kind) {
  return kind == ChecksumKind::Crc32 ? "crc32" : "xxh3-64";
}

std::optional<ChecksumKind> checksum_kind(const std::string& name) {
  if (name == "crc32") return ChecksumKind::Crc32;
  if (name == "xxh3-64") return ChecksumKind::Xxh3_64;
  return std::nullopt;
}

uint64_t checksum_of(ChecksumKind kind, const void* data, size_t bytes, bool parallel) {
  if (kind == ChecksumKind::Crc32) return crc32_of(data, bytes, parallel);
  return XXH3_64bits(data, bytes);
}

std::vector<uint64_t> xxh3_each(const std::vector<std::pair<const void*, size_t>>& spans,
                                int threads) {
  std::vector<uint64_t> out(spans.size(), 0);
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return spans[a].second > spans[b].second; });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();)
      out[order[k]] = XXH3_64bits(spans[order[k]].first, spans[order[k]].second);
  };
  const int n = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(spans.size(), 1)));
  std::vector<std::thread> workers;
  for (int t = 1; t < n; ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  return out;
}

struct Xxh3Stream::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {
  PENTAD_CHECK(state_->xxh != nullptr, "cannot allocate an xxh3 state");
  reset();
}

Xxh3Stream::~Xxh3Stream() = default;

void Xxh3Stream::reset() {
  XXH3_64bits_reset(state_->xxh);
}

void Xxh3Stream::update(const void* data, size_t bytes) {
  XXH3_64bits_update(state_->xxh, data, bytes);
}

uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(state_->xxh);
}

}  // namespace pentad::ckpt
