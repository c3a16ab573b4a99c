#pragma once
// The kernel table of this machine for the planner's cost model (plan/cost_model.h): how
// long the real CPU kernels of kernels/ops.h take at a few shapes, measured by
// `pentad plan --calibrate` and kept as JSON (default ~/.cache/pentad/calibration.json).
// Measured at one thread and at every core, since a rank's threads are the cores over the
// ranks on the machine (launch/rank.cpp): 8 ranks on 2 cores compute with one thread each.
#include <string>
#include <vector>

namespace pentad {

struct KernelRates {  // one thread count
  int threads = 1;
  // GEMM rate against size: (flops of one linear forward + backward, FLOP/s), rising flops.
  std::vector<std::pair<double, double>> gemm;
  double attention_flops_per_s = 0;  // causal attention forward + backward, counted flops
  // The same at a few key lengths (keys a call sees, rising): short calls, such as ring
  // attention's blocks, run slower. Empty (an older file): attention_flops_per_s throughout.
  std::vector<std::pair<double, double>> attention_by_keys;
  double elementwise_bytes_per_s = 0;  // norms, residual adds, activations: bytes touched
  double adamw_params_per_s = 0;       // AdamW update, parameters a second
  double copy_bytes_per_s = 0;         // memcpy: what shared-memory messages move at
};

struct Calibration {
  std::string machine;             // hostname, CPU model
  int cores = 1;                   // the cores the measuring process could use
  std::vector<KernelRates> rates;  // threads 1 and `cores` (one entry when cores == 1)

  // Rates at `threads` (interpolated in threads between the measured ones).
  KernelRates at_threads(int threads) const;
  // Seconds of one linear forward + backward of flops `flops` at these rates.
  static double gemm_seconds(const KernelRates& r, double flops);
  // Seconds of attention of `counted_flops` done in calls that each see `keys` keys.
  static double attention_seconds(const KernelRates& r, double counted_flops, double keys);

  static Calibration read(const std::string& path);  // pentad::Error naming the file
  void write(const std::string& path) const;
};

// Times the kernels (about 10 s on 2 cores). `log` gets one line per measurement.
Calibration calibrate(bool verbose);

// The default calibration file: $PENTAD_CALIBRATION, else $XDG_CACHE_HOME/pentad or
// ~/.cache/pentad, calibration.json.
std::string default_calibration_path();

}  // namespace pentad
