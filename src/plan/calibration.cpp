// `pentad plan --calibrate`: the kernel table of this machine (plan/calibration.h), timed on
// the kernels training runs (kernels/ops.h), each a median over repetitions after a warm-up.
#include "plan/calibration.h"

#include <omp.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/check.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using json = nlohmann::json;

// Random values in [-1, 1): a kernel fed zeros can run faster than on real data.
std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = float(seed >> 8) / float(1u << 23) - 1.0f;
  }
  return v;
}

Tensor host_view(std::vector<float>& v, Shape shape) {
  return view_of(v.data(), shape);
}

// Median seconds of `run`: one warm-up, then at least 3 runs and 0.1 s.
double median_seconds(const std::function<void()>& run) {
  run();
  std::vector<double> times;
  double total = 0;
  while (times.size() < 3 || (total < 0.1 && times.size() < 50)) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    times.push_back(s);
    total += s;
  }
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// Linear forward + backward of (N, C) -> (N, OC): 6 N C OC flops.
double time_linear(int64_t N, int64_t C, int64_t OC) {
  auto inp = random_values(N * C, 1), w = random_values(OC * C, 2), out = random_values(N * OC, 3);
  auto dout = random_values(N * OC, 4), dinp = random_values(N * C, 5),
       dw = random_values(OC * C, 6);
  const Tensor ti = host_view(inp, {N, C}), tw = host_view(w, {OC, C}),
               to = host_view(out, {N, OC});
  return median_seconds([&] {
    kernels::linear_forward(to, ti, tw, Tensor{});
    kernels::linear_backward(host_view(dinp, {N, C}), host_view(dw, {OC, C}), Tensor{},
                             host_view(dout, {N, OC}), ti, tw, false);
  });
}

KernelRates measure(int threads, bool verbose) {
  omp_set_num_threads(threads);
  KernelRates r;
  r.threads = threads;
  // Shapes from a tiny model's heads up to GPT-2's MLP width: the rate rises with size.
  const int64_t shapes[][3] = {{64, 32, 32},      {128, 64, 64},    {256, 64, 256},
                               {256, 128, 128},   {512, 128, 512},  {512, 256, 256},
                               {1024, 256, 1024}, {1024, 512, 512}, {2048, 512, 2048}};
  for (const auto& s : shapes) {
    const double flops = 6.0 * double(s[0] * s[1] * s[2]);
    r.gemm.emplace_back(flops, flops / time_linear(s[0], s[1], s[2]));
  }
  std::sort(r.gemm.begin(), r.gemm.end());
  // Causal attention, 4 heads of 32, at sequences of 64 to 512 tokens (b 8 to 1: the same
  // tokens), counted as the model counts it; the 512's is the single rate.
  for (const int64_t t : {64, 128, 256, 512}) {
    const int64_t b = 512 / t, h = 4, d = 32, C = h * d;
    auto q = random_values(b * t * C, 7), k = random_values(b * t * C, 8),
         v = random_values(b * t * C, 9);
    auto out = random_values(b * t * C, 10), lse = random_values(b * h * t, 11);
    auto dq = q, dk = k, dv = v, dout = random_values(b * t * C, 12);
    const Shape qs{b, t, h, d};
    const double s = median_seconds([&] {
      kernels::attention_forward(host_view(out, qs), host_view(lse, {b, h, t}), host_view(q, qs),
                                 host_view(k, qs), host_view(v, qs));
      kernels::attention_backward(host_view(dq, qs), host_view(dk, qs), host_view(dv, qs),
                                  host_view(dout, qs), host_view(q, qs), host_view(k, qs),
                                  host_view(v, qs), host_view(out, qs), host_view(lse, {b, h, t}));
    });
    r.attention_by_keys.emplace_back(double(t), 6.0 * double(b * t) * double(C) * double(t) / s);
    r.attention_flops_per_s = r.attention_by_keys.back().second;
  }
  {  // layernorm forward + backward and a residual add: 5 + 3 passes over N x C floats
    const int64_t N = 16384, C = 256;  // 16 MiB a tensor: beyond the caches
    auto x = random_values(N * C, 13), y = random_values(N * C, 14), dx = random_values(N * C, 15);
    auto w = random_values(C, 16), bias = random_values(C, 17), dw = w, db = bias;
    auto mean = random_values(N, 18), rstd = random_values(N, 19);
    const double s = median_seconds([&] {
      kernels::layernorm_forward(host_view(y, {N, C}), host_view(mean, {N}), host_view(rstd, {N}),
                                 host_view(x, {N, C}), host_view(w, {C}), host_view(bias, {C}),
                                 1e-5f);
      kernels::layernorm_backward(host_view(dx, {N, C}), host_view(dw, {C}), host_view(db, {C}),
                                  host_view(y, {N, C}), host_view(x, {N, C}), host_view(w, {C}),
                                  host_view(mean, {N}), host_view(rstd, {N}));
      kernels::add(host_view(y, {N, C}), host_view(x, {N, C}), host_view(dx, {N, C}));
    });
    r.elementwise_bytes_per_s = 8.0 * double(N * C) * 4.0 / s;
  }
  {  // AdamW over 8M parameters (128 MiB of state: beyond the caches, as in training)
    const int64_t n = 1 << 23;
    auto p = random_values(n, 20), g = random_values(n, 21), m = random_values(n, 22);
    auto v = random_values(n, 23);
    for (float& x : v) x = x * x;
    const double s = median_seconds([&] {
      kernels::adamw_update(host_view(p, {n}), host_view(m, {n}), host_view(v, {n}),
                            host_view(g, {n}), 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10);
    });
    r.adamw_params_per_s = double(n) / s;
  }
  {  // memcpy of 32 MiB (one thread: what a message's copy gets)
    std::vector<char> a(32 << 20, 1), b(32 << 20, 2);
    const double s = median_seconds([&] { std::memcpy(b.data(), a.data(), a.size()); });
    r.copy_bytes_per_s = double(a.size()) / s;
  }
  return r;
}

// Whether other processes leave the cores within the next second (quarter-second looks).
bool cores_quiet_soon() {
  for (int look = 0; look < 4; ++look) {
    const OthersCpu others;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    if (others.share() <= kMaxOthersShare) return true;
  }
  return false;
}

// measure(threads), timed again while other processes took more than kMaxOthersShare of the
// cores (beside two busy processes on 2 cores, 55-101 GFLOP/s a core for GEMMs that run at
// 113-162 on the same idle cores) and have left them since; the least shared of at most
// three tries. Under a steady load one try and a second's look.
KernelRates measure_when_idle(int threads, bool verbose) {
  KernelRates best;
  best.others_share = 2;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const OthersCpu others;
    KernelRates r = measure(threads, verbose);
    r.others_share = std::max(0.0, others.share());  // unknown: taken as idle
    const bool busy = r.others_share > kMaxOthersShare;
    const bool again = busy && attempt < 3 && cores_quiet_soon();
    if (verbose)
      spdlog::info(
          "calibration, {} thread{}: GEMM {:.1f}-{:.1f} GFLOP/s, attention {:.1f} GFLOP/s, "
          "element-wise {:.1f} GB/s, AdamW {:.0f} M params/s, copy {:.1f} GB/s; other processes "
          "used {:.0f}% of the cores{}",
          threads, threads == 1 ? "" : "s", r.gemm.front().second / 1e9, r.gemm.back().second / 1e9,
          r.attention_flops_per_s / 1e9, r.elementwise_bytes_per_s / 1e9,
          r.adamw_params_per_s / 1e6, r.copy_bytes_per_s / 1e9, 100 * r.others_share,
          again                 ? ": timing again"
          : busy && attempt < 3 ? ", and still do"
                                : "");
    if (r.others_share < best.others_share) best = std::move(r);
    if (!again) break;
  }
  return best;
}

// Busy seconds of the cores in `cpus` since boot, from /proc/stat's per-core lines (user,
// nice, system, irq, softirq and steal; guest time is inside user); negative if unreadable.
double busy_seconds(const cpu_set_t& cpus) {
  std::ifstream in("/proc/stat");
  if (!in) return -1;
  const double tick = double(sysconf(_SC_CLK_TCK));
  double busy = 0;
  bool any = false;
  std::string name;
  while (in >> name) {
    if (name.rfind("cpu", 0) != 0) break;  // the cpu lines come first
    double f[8] = {};                      // user nice system idle iowait irq softirq steal
    for (double& x : f) in >> x;
    in.ignore(1 << 12, '\n');
    if (name == "cpu") continue;  // the sum over all cores
    const int id = std::atoi(name.c_str() + 3);
    if (id < 0 || id >= CPU_SETSIZE || !CPU_ISSET(id, &cpus)) continue;
    busy += (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / tick;
    any = true;
  }
  return any ? busy : -1;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

cpu_set_t own_cpus() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) CPU_ZERO(&cpus);
  return cpus;
}

json rates_json(const KernelRates& r) {
  json gemm = json::array();
  for (const auto& [flops, rate] : r.gemm)
    gemm.push_back({{"flops", flops}, {"flops_per_s", rate}});
  json attention = json::array();
  for (const auto& [keys, rate] : r.attention_by_keys)
    attention.push_back({{"keys", keys}, {"flops_per_s", rate}});
  return {{"threads", r.threads},
          {"gemm", gemm},
          {"attention_flops_per_s", r.attention_flops_per_s},
          {"attention_by_keys", attention},
          {"elementwise_bytes_per_s", r.elementwise_bytes_per_s},
          {"adamw_params_per_s", r.adamw_params_per_s},
          {"copy_bytes_per_s", r.copy_bytes_per_s},
          {"others_share", r.others_share}};
}

double calibration_positive(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() > 0))
    fail(
        "calibration file {}: \"{}\" is missing or not a positive number; rerun `pentad plan "
        "--calibrate`",
        path, key);
  return j[key].get<double>();
}

}  // namespace

OthersCpu::OthersCpu() : cpus_(own_cpus()) {
  cores_ = std::max(1, CPU_COUNT(&cpus_));
  busy_ = busy_seconds(cpus_);
  own_ = process_cpu_seconds();
  wall_ = wall_seconds();
}

double OthersCpu::seconds() const {
  if (busy_ < 0) return -1;
  const double busy = busy_seconds(cpus_);
  if (busy < 0) return -1;
  return std::max(0.0, (busy - busy_) - (process_cpu_seconds() - own_));
}

double OthersCpu::share() const {
  const double others = seconds();
  const double wall = wall_seconds() - wall_;
  // At most 1: the counters move in ticks (10 ms a core), so a fully busy interval can read
  // a little over the cores' time.
  return others < 0 || wall <= 0 ? -1 : std::min(1.0, others / (wall * cores_));
}

double Calibration::others_share() const {
  double most = 0;
  for (const KernelRates& r : rates) most = std::max(most, r.others_share);
  return most;
}

KernelRates Calibration::at_threads(int threads) const {
  PENTAD_CHECK(!rates.empty(), "empty calibration");
  if (rates.size() == 1 || threads <= rates.front().threads) return rates.front();
  const KernelRates &lo = rates.front(), &hi = rates.back();
  if (threads >= hi.threads) return hi;
  // Linear in threads between the two measured counts, rate by rate.
  const double w = double(threads - lo.threads) / double(hi.threads - lo.threads);
  auto mix = [w](double a, double b) { return a + w * (b - a); };
  KernelRates r = lo;
  r.threads = threads;
  for (size_t i = 0; i < r.gemm.size() && i < hi.gemm.size(); ++i)
    r.gemm[i].second = mix(lo.gemm[i].second, hi.gemm[i].second);
  r.attention_flops_per_s = mix(lo.attention_flops_per_s, hi.attention_flops_per_s);
  for (size_t i = 0; i < r.attention_by_keys.size() && i < hi.attention_by_keys.size(); ++i)
    r.attention_by_keys[i].second =
        mix(lo.attention_by_keys[i].second, hi.attention_by_keys[i].second);
  r.elementwise_bytes_per_s = mix(lo.elementwise_bytes_per_s, hi.elementwise_bytes_per_s);
  r.adamw_params_per_s = mix(lo.adamw_params_per_s, hi.adamw_params_per_s);
  return r;
}

namespace {
// The rate at x of a table of (x, rate) rising in x: the end's rate beyond either end,
// else interpolated in log(x) between the neighbouring entries.
double rate_at(const std::vector<std::pair<double, double>>& table, double x) {
  if (x <= table.front().first) return table.front().second;
  if (x >= table.back().first) return table.back().second;
  size_t i = 1;
  while (table[i].first < x) ++i;
  const double w = std::log(x / table[i - 1].first) / std::log(table[i].first / table[i - 1].first);
  return table[i - 1].second + w * (table[i].second - table[i - 1].second);
}
}  // namespace

double Calibration::gemm_seconds(const KernelRates& r, double flops) {
  return flops <= 0 ? 0 : flops / rate_at(r.gemm, flops);  // by size, between the shapes
}

double Calibration::attention_seconds(const KernelRates& r, double counted_flops, double keys) {
  if (counted_flops <= 0) return 0;
  if (r.attention_by_keys.empty()) return counted_flops / r.attention_flops_per_s;
  return counted_flops / rate_at(r.attention_by_keys, keys);  // by length, between them
}

void warn_busy(const Calibration& c, const std::string& path) {
  spdlog::warn(
      "calibration {} was timed while other processes used {:.0f}% of the cores: its rates read "
      "low (predicted steps too long, MFU too high); rerun `pentad plan --calibrate` on an idle "
      "machine",
      path, 100 * c.others_share());
}

Calibration calibrate(bool verbose) {
  Calibration c;
  c.machine = host_name();
  c.cores = std::max(1, omp_get_num_procs());
  c.blas_core = kernels::cpu::blas_core();
  const int saved = omp_get_max_threads();
  c.rates.push_back(measure_when_idle(1, verbose));
  if (c.cores > 1) c.rates.push_back(measure_when_idle(c.cores, verbose));
  omp_set_num_threads(saved);
  return c;
}

void Calibration::write(const std::string& path) const {
  json rates_j = json::array();
  for (const KernelRates& r : rates) rates_j.push_back(rates_json(r));
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(path);
  if (!out) fail("cannot write the calibration file {}", path);
  out << json{{"version", 1},
              {"machine", machine},
              {"cores", cores},
              {"blas_core", blas_core},
              {"rates", rates_j}}
             .dump(1)
      << "\n";
}

Calibration Calibration::read(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail(
        "no calibration file {}: run `pentad plan --calibrate` on this machine first (or give "
        "--cluster for a GPU cluster)",
        path);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    fail("calibration file {} is not JSON ({}); rerun `pentad plan --calibrate`", path, e.what());
  }
  Calibration c;
  try {  // a field of another type (a hand-edited file): its name, not an uncaught throw
    c.machine = j.value("machine", "");
    c.cores = j.value("cores", 1);
    c.blas_core = j.value("blas_core", "");
    if (!j.contains("rates") || !j["rates"].is_array() || j["rates"].empty())
      fail("calibration file {}: no \"rates\"; rerun `pentad plan --calibrate`", path);
    for (const json& rj : j["rates"]) {
      KernelRates r;
      r.threads = rj.value("threads", 1);
      for (const json& g : rj.value("gemm", json::array()))
        r.gemm.emplace_back(calibration_positive(g, "flops", path),
                            calibration_positive(g, "flops_per_s", path));
      if (r.gemm.empty()) fail("calibration file {}: no \"gemm\" rates", path);
      std::sort(r.gemm.begin(), r.gemm.end());
      r.attention_flops_per_s = calibration_positive(rj, "attention_flops_per_s", path);
      for (const json& a : rj.value("attention_by_keys", json::array()))
        r.attention_by_keys.emplace_back(calibration_positive(a, "keys", path),
                                         calibration_positive(a, "flops_per_s", path));
      std::sort(r.attention_by_keys.begin(), r.attention_by_keys.end());
      r.elementwise_bytes_per_s = calibration_positive(rj, "elementwise_bytes_per_s", path);
      r.adamw_params_per_s = calibration_positive(rj, "adamw_params_per_s", path);
      r.copy_bytes_per_s = calibration_positive(rj, "copy_bytes_per_s", path);
      r.others_share = rj.value("others_share", 0.0);
      c.rates.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    fail(
        "calibration file {}: a field is not what pentad writes ({}); rerun `pentad plan "
        "--calibrate`",
        path, e.what());
  }
  std::sort(c.rates.begin(), c.rates.end(),
            [](const KernelRates& a, const KernelRates& b) { return a.threads < b.threads; });
  if (c.others_share() > kMaxOthersShare) warn_busy(c, path);
  // A home directory shared by a cluster's nodes shares ~/.cache/pentad too.
  if (const std::string host = host_name(); !c.machine.empty() && c.machine != host)
    spdlog::warn(
        "calibration {} was timed on {}, and this is {}: its rates are that machine's; run "
        "`pentad plan --calibrate --calibration FILE` here for this one's",
        path, c.machine, host);
  if (const std::string running = kernels::cpu::blas_core();
      c.blas_core.empty() && !running.empty())
    spdlog::warn(
        "calibration {} does not say which OpenBLAS kernels it was timed with (a file older than "
        "that record): if they were others than this process's {}, its GEMM rates are off (several "
        "times between the generic and the AVX-512 ones); rerun `pentad plan --calibrate`",
        path, running);
  else if (!c.blas_core.empty() && !running.empty() && c.blas_core != running)
    spdlog::warn(
        "calibration {} was timed with OpenBLAS's {} kernels and this process runs its {}: the "
        "GEMM rates differ (several times between the generic and the AVX-512 ones); rerun "
        "`pentad plan --calibrate`",
        path, c.blas_core, running);
  return c;
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("PENTAD_CALIBRATION"); p && *p) return p;
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = std::string(h) + "/.cache";
  else
    base = ".";
  return base + "/pentad/calibration.json";
}

}  // namespace pentad
