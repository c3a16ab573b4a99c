#pragma once
// The limits of the job this process runs in, as its control groups set them: Slurm,
// Kubernetes, docker and systemd confine a job to less memory and fewer CPUs than the
// machine has, and the machine's totals (sysconf, the affinity mask) say nothing of that.
// The limits are read from the process's own cgroup (/proc/self/cgroup) and every cgroup
// above it, cgroup v1, v2 or both (a hybrid host), and the tightest one on the path wins.
// A file that is missing or cannot be read sets no limit; nothing here throws.
#include <cstdint>
#include <string>
#include <string_view>

namespace pentad {

// The directory that stands for "/" when the files are looked up: the environment variable
// PENTAD_CGROUP_ROOT when it is set and not empty (tests build fake trees there), else "/".
std::string cgroup_root();

// Memory. A value of 0 is no limit.
struct CgroupMemory {
  // The hard limit in bytes: v2 memory.max, v1 memory.limit_in_bytes and
  // memory.memsw.limit_in_bytes; above it the kernel reclaims and then kills.
  int64_t limit = 0;
  std::string source;  // what set it: "cgroup /slurm/job_42 (memory.max)"
  // The soft bound in bytes, v2 memory.high: above it the kernel throttles the job and
  // reclaims its memory (slow, not fatal).
  int64_t high = 0;
  std::string high_source;  // "cgroup /slurm/job_42 (memory.high)"
};
CgroupMemory cgroup_memory(const std::string& root = cgroup_root());

// CPUs. `cpus` is min(the quota rounded up to at least 1, the cpuset, the affinity mask),
// over what is known, and at least 1.
struct CgroupCpus {
  // CPUs the bandwidth quota allows (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us):
  // 1.5 for 150000 us every 100000 us. 0: no quota.
  double quota = 0;
  std::string quota_source;  // "cgroup /x (cpu.max 150000 100000)"
  // CPUs in the cpuset (v2 cpuset.cpus.effective, v1 cpuset.cpus). 0: none found.
  int cpuset = 0;
  std::string cpuset_source;  // "cgroup /x (cpuset.cpus.effective 0-1,4)"
  int affinity = 0;           // as given to cgroup_cpus; 0: not known
  int cpus = 1;
  // What decided `cpus`: "cgroup /x (cpu.max 150000 100000 = 1.5 CPUs, rounded up)",
  // "cgroup /x (cpuset.cpus 0-1,4 = 3 CPUs)" or "the affinity mask (8 CPUs)".
  std::string source;
};
// `affinity`: the CPUs of this process's affinity mask (affinity_cpus(), or OpenMP's
// omp_get_num_procs()); 0 or less when not known.
CgroupCpus cgroup_cpus(int affinity, const std::string& root = cgroup_root());

// The CPUs in this process's affinity mask (sched_getaffinity); 0 when it cannot be read.
int affinity_cpus();

// The CPUs of a cpuset list: "0-3,8" is 5. 0 for an empty or malformed list.
int cpu_list_count(std::string_view list);

}  // namespace pentad
