#pragma once
// The kernel table of this machine for the planner's cost model (plan/cost_model.h): how
// long the real CPU kernels of kernels/ops.h take at a few shapes, measured by
// `pentad plan --calibrate` and kept as JSON (default ~/.cache/pentad/calibration.json).
// Measured at one thread and at every core, since a rank's threads are the cores over the
// ranks on the machine (launch/rank.cpp): 8 ranks on 2 cores compute with one thread each.
#include <sched.h>

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
  // The share of this process's cores that other processes (and the hypervisor: steal) used
  // while the table was timed; 0 in older files. Over kMaxOthersShare the rates read low.
  double others_share = 0;
};

struct Calibration {
  std::string machine;  // hostname, CPU model
  int cores = 1;        // the cores the measuring process could use
  // OpenBLAS's kernels it was timed with (kernels/cpu/blas_core.h); empty in older files.
  // Others (another OPENBLAS_CORETYPE, or a build before pentad chose them) run at other rates.
  std::string blas_core;
  std::vector<KernelRates> rates;  // threads 1 and `cores` (one entry when cores == 1)

  // Rates at `threads` (interpolated in threads between the measured ones).
  KernelRates at_threads(int threads) const;
  // Seconds of one linear forward + backward of flops `flops` at these rates.
  static double gemm_seconds(const KernelRates& r, double flops);
  // Seconds of attention of `counted_flops` done in calls that each see `keys` keys.
  static double attention_seconds(const KernelRates& r, double counted_flops, double keys);

  // The most any table's timing shared its cores with other processes (KernelRates).
  double others_share() const;

  // pentad::Error naming the file; a warning where the table was timed on busy cores or
  // with other OpenBLAS kernels than this process runs.
  static Calibration read(const std::string& path);
  void write(const std::string& path) const;
};

// Above this share of the cores used by other processes, a table is timed again once they
// have left (up to three times, the least shared kept) and, if still above, written with a
// warning.
inline constexpr double kMaxOthersShare = 0.1;

// CPU time that other processes took from the cores this process may run on (its affinity
// mask at the start), from /proc/stat's per-core counters less this process's own CPU time. Unknown
// (negative) where /proc/stat cannot be read.
class OthersCpu {
 public:
  OthersCpu();  // starts counting
  // Seconds of the cores' time used by others since the start, and that over the cores'
  // wall time (the share, at most 1); both negative where unknown.
  double seconds() const;
  double share() const;

 private:
  cpu_set_t cpus_;  // counted at the end as at the start
  double busy_ = -1, own_ = 0, wall_ = 0;
  int cores_ = 1;
};

// Times the kernels (about 4 s on 2 idle cores; longer where other processes come and go).
// `verbose`: one line per table.
Calibration calibrate(bool verbose);
// The warning for a table timed on busy cores (Calibration::read's, and --calibrate's).
void warn_busy(const Calibration& c, const std::string& path);

// The default calibration file: $PENTAD_CALIBRATION, else $XDG_CACHE_HOME/pentad or
// ~/.cache/pentad, calibration.json.
std::string default_calibration_path();

}  // namespace pentad
