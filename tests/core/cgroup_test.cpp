// The job's limits from its cgroups (core/cgroup.h), read from fake trees: a temporary
// directory stands for "/" with the files a v1, v2 or hybrid host would have.
#include "core/cgroup.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace pentad;

namespace {

constexpr int64_t kCgroupGiB = int64_t{1} << 30;

// A fake root: a fresh temporary directory, removed with the object.
class CgroupTree {
 public:
  CgroupTree() {
    static int trees = 0;
    root_ = std::filesystem::temp_directory_path() /
            fmt::format("pentad_cgroup_test_{}_{}", getpid(), trees++);
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~CgroupTree() {
    std::error_code error;
    std::filesystem::remove_all(root_, error);
  }
  CgroupTree(const CgroupTree&) = delete;
  CgroupTree& operator=(const CgroupTree&) = delete;

  // Writes `text` and a newline to `path` (relative to the root), making its directories.
  void write(const std::string& path, const std::string& text) const {
    const std::filesystem::path file = root_ / path;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  }
  void mkdir(const std::string& path) const { std::filesystem::create_directories(root_ / path); }
  std::filesystem::path path(const std::string& relative) const { return root_ / relative; }
  std::string root() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

}  // namespace

// v2: one line "0::/path" and the hierarchy at /sys/fs/cgroup. The job's limit is found in
// the job's cgroup although the process sits in a step below it, and "max" there is none.
TEST(Cgroup, V2MemoryOfTheJobAboveTheStep) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/slurm/job_42/step_0");
  t.write("sys/fs/cgroup/slurm/job_42/step_0/memory.max", "max");
  t.write("sys/fs/cgroup/slurm/job_42/memory.max", std::to_string(10 * kCgroupGiB));
  t.write("sys/fs/cgroup/slurm/job_42/memory.high", std::to_string(8 * kCgroupGiB));
  t.write("sys/fs/cgroup/slurm/memory.max", "max");
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, 10 * kCgroupGiB);
  EXPECT_EQ(m.source, "cgroup /slurm/job_42 (memory.max)");
  EXPECT_EQ(m.high, 8 * kCgroupGiB);
  EXPECT_EQ(m.high_source, "cgroup /slurm/job_42 (memory.high)");
}

// v1: a line per controller, a hierarchy per controller (cpu shares one with cpuacct). The
// root's huge limit_in_bytes is none; memsw (memory and swap) counts as a limit too.
TEST(Cgroup, V1MemoryCpuQuotaAndCpuset) {
  CgroupTree t;
  t.write("proc/self/cgroup",
          "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n"
          "1:name=systemd:/docker/abc");
  t.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712");
  t.write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", std::to_string(2 * kCgroupGiB));
  t.write("sys/fs/cgroup/memory/docker/abc/memory.memsw.limit_in_bytes",
          std::to_string(3 * kCgroupGiB));
  t.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1");
  t.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000");
  t.write("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000");
  t.write("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  t.write("sys/fs/cgroup/cpuset/cpuset.cpus", "0-63");
  t.write("sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-1,4");

  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, 2 * kCgroupGiB);
  EXPECT_EQ(m.source, "cgroup /docker/abc (memory.limit_in_bytes)");
  EXPECT_EQ(m.high, 0) << "v1 has no soft bound";

  const CgroupCpus c = cgroup_cpus(64, t.root());
  EXPECT_DOUBLE_EQ(c.quota, 1.5);
  EXPECT_EQ(c.quota_source,
            "cgroup /docker/abc (cpu.cfs_quota_us 150000 / cpu.cfs_period_us 100000)");
  EXPECT_EQ(c.cpuset, 3);
  EXPECT_EQ(c.cpuset_source, "cgroup /docker/abc (cpuset.cpus 0-1,4)");
  EXPECT_EQ(c.affinity, 64);
  EXPECT_EQ(c.cpus, 2);
  EXPECT_EQ(c.source,
            "cgroup /docker/abc (cpu.cfs_quota_us 150000 / cpu.cfs_period_us 100000 = 1.5 CPUs, "
            "rounded up)");

  // Swap's limit alone (memory itself unlimited) bounds the memory too.
  t.write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712");
  const CgroupMemory swap = cgroup_memory(t.root());
  EXPECT_EQ(swap.limit, 3 * kCgroupGiB);
  EXPECT_EQ(swap.source, "cgroup /docker/abc (memory.memsw.limit_in_bytes)");

  // Without cpu,cpuacct the quota is looked for under cpu/.
  std::filesystem::rename(t.path("sys/fs/cgroup/cpu,cpuacct"), t.path("sys/fs/cgroup/cpu"));
  EXPECT_DOUBLE_EQ(cgroup_cpus(64, t.root()).quota, 1.5);
}

// A hybrid host: memory and cpu in v1 hierarchies, v2 mounted at /sys/fs/cgroup/unified.
// Both are read and the tightest wins; nothing is read from /sys/fs/cgroup itself, which on
// such a host holds only the mount points.
TEST(Cgroup, HybridReadsBothHierarchies) {
  CgroupTree t;
  t.write("proc/self/cgroup",
          "7:memory:/user.slice/job.scope\n5:cpu,cpuacct:/user.slice/job.scope\n"
          "0::/user.slice/job.scope");
  t.write("sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes", std::to_string(4 * kCgroupGiB));
  t.write("sys/fs/cgroup/unified/user.slice/job.scope/memory.max", std::to_string(6 * kCgroupGiB));
  t.write("sys/fs/cgroup/unified/user.slice/job.scope/memory.high", std::to_string(5 * kCgroupGiB));
  t.write("sys/fs/cgroup/user.slice/job.scope/memory.max", std::to_string(kCgroupGiB));  // decoy
  t.write("sys/fs/cgroup/cpu,cpuacct/user.slice/job.scope/cpu.cfs_quota_us", "400000");
  t.write("sys/fs/cgroup/cpu,cpuacct/user.slice/job.scope/cpu.cfs_period_us", "100000");
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, 4 * kCgroupGiB);
  EXPECT_EQ(m.source, "cgroup /user.slice (memory.limit_in_bytes)");
  EXPECT_EQ(m.high, 5 * kCgroupGiB);
  EXPECT_EQ(m.high_source, "cgroup /user.slice/job.scope (memory.high)");
  const CgroupCpus c = cgroup_cpus(16, t.root());
  EXPECT_EQ(c.cpus, 4);
  EXPECT_EQ(c.source,
            "cgroup /user.slice/job.scope (cpu.cfs_quota_us 400000 / cpu.cfs_period_us 100000 = "
            "4 CPUs)");
}

// The tightest limit on the path wins, wherever it is: here a parent's, below the child's.
TEST(Cgroup, AParentTighterThanTheChildWins) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/a/b/c");
  t.write("sys/fs/cgroup/a/memory.max", std::to_string(kCgroupGiB));
  t.write("sys/fs/cgroup/a/b/memory.max", std::to_string(4 * kCgroupGiB));
  t.write("sys/fs/cgroup/a/b/c/memory.max", "max");
  t.write("sys/fs/cgroup/a/cpu.max", "200000 100000");
  t.write("sys/fs/cgroup/a/b/c/cpu.max", "300000 100000");
  t.write("sys/fs/cgroup/cpuset.cpus.effective", "0-63");
  t.write("sys/fs/cgroup/a/b/c/cpuset.cpus.effective", "0-7");
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, kCgroupGiB);
  EXPECT_EQ(m.source, "cgroup /a (memory.max)");
  const CgroupCpus c = cgroup_cpus(64, t.root());
  EXPECT_DOUBLE_EQ(c.quota, 2.0);
  EXPECT_EQ(c.quota_source, "cgroup /a (cpu.max 200000 100000)");
  EXPECT_EQ(c.cpuset, 8);
  EXPECT_EQ(c.cpus, 2);
  EXPECT_EQ(c.source, "cgroup /a (cpu.max 200000 100000 = 2 CPUs)");
}

// "max" everywhere is no limit: the affinity mask decides the CPUs, and with no count at
// all one CPU is assumed.
TEST(Cgroup, MaxIsNoLimit) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/job");
  t.write("sys/fs/cgroup/job/memory.max", "max");
  t.write("sys/fs/cgroup/job/memory.high", "max");
  t.write("sys/fs/cgroup/job/cpu.max", "max 100000");
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, 0);
  EXPECT_EQ(m.source, "");
  EXPECT_EQ(m.high, 0);
  const CgroupCpus c = cgroup_cpus(8, t.root());
  EXPECT_EQ(c.quota, 0.0);
  EXPECT_EQ(c.cpuset, 0);
  EXPECT_EQ(c.cpus, 8);
  EXPECT_EQ(c.source, "the affinity mask (8 CPUs)");
  EXPECT_EQ(cgroup_cpus(0, t.root()).cpus, 1);
}

// A quota of 1.5 CPUs allows 2 threads; below one CPU, one; the affinity mask can still be
// tighter (and then names itself).
TEST(Cgroup, QuotaRoundsUp) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/x");
  t.write("sys/fs/cgroup/x/cpu.max", "150000 100000");
  CgroupCpus c = cgroup_cpus(64, t.root());
  EXPECT_DOUBLE_EQ(c.quota, 1.5);
  EXPECT_EQ(c.cpus, 2);
  EXPECT_EQ(c.source, "cgroup /x (cpu.max 150000 100000 = 1.5 CPUs, rounded up)");
  c = cgroup_cpus(1, t.root());
  EXPECT_EQ(c.cpus, 1);
  EXPECT_EQ(c.source, "the affinity mask (1 CPU)");
  t.write("sys/fs/cgroup/x/cpu.max", "50000 100000");
  c = cgroup_cpus(64, t.root());
  EXPECT_EQ(c.cpus, 1);
  EXPECT_EQ(c.source, "cgroup /x (cpu.max 50000 100000 = 0.5 CPUs, rounded up to 1)");
}

TEST(Cgroup, CpusetLists) {
  EXPECT_EQ(cpu_list_count("0-1,4"), 3);
  EXPECT_EQ(cpu_list_count("0-3,8"), 5);
  EXPECT_EQ(cpu_list_count("7"), 1);
  EXPECT_EQ(cpu_list_count("0-3\n"), 4);
  EXPECT_EQ(cpu_list_count(""), 0);
  EXPECT_EQ(cpu_list_count("3-1"), 0);
  EXPECT_EQ(cpu_list_count("0-x"), 0);
  EXPECT_EQ(cpu_list_count("0,,2"), 0);

  CgroupTree t;
  t.write("proc/self/cgroup", "0::/x");
  t.write("sys/fs/cgroup/x/cpuset.cpus.effective", "0-1,4");
  const CgroupCpus c = cgroup_cpus(64, t.root());
  EXPECT_EQ(c.cpuset, 3);
  EXPECT_EQ(c.cpus, 3);
  EXPECT_EQ(c.source, "cgroup /x (cpuset.cpus.effective 0-1,4 = 3 CPUs)");
}

// A file that cannot be read sets no limit, and the walk goes on to the parents: a directory
// where the file should be (unreadable even by root), then a file without permissions.
TEST(Cgroup, UnreadableFilesAreSkipped) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/a/b");
  t.mkdir("sys/fs/cgroup/a/b/memory.max");
  t.mkdir("sys/fs/cgroup/a/b/cpu.max");
  t.write("sys/fs/cgroup/a/memory.max", std::to_string(3 * kCgroupGiB));
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, 3 * kCgroupGiB);
  EXPECT_EQ(m.source, "cgroup /a (memory.max)");
  EXPECT_EQ(cgroup_cpus(4, t.root()).cpus, 4);

  // Nor is a missing tree, or garbage in a file, an error.
  EXPECT_EQ(cgroup_memory(t.root() + "/nowhere").limit, 0);
  t.write("sys/fs/cgroup/a/memory.max", "lots");
  EXPECT_EQ(cgroup_memory(t.root()).limit, 0);

  if (geteuid() == 0) GTEST_SKIP() << "root reads a file whatever its permissions";
  t.write("sys/fs/cgroup/a/memory.max", std::to_string(3 * kCgroupGiB));
  t.write("sys/fs/cgroup/memory.max", std::to_string(5 * kCgroupGiB));
  ASSERT_EQ(chmod(t.path("sys/fs/cgroup/a/memory.max").c_str(), 0), 0);
  EXPECT_EQ(cgroup_memory(t.root()).limit, 5 * kCgroupGiB);
}

// mountinfo says where a hierarchy is mounted and which cgroup its mount point shows: in a
// container without a cgroup namespace, /proc/self/cgroup names the host's path, and the
// mount point is that cgroup itself. A space in a mount point is written \040.
TEST(Cgroup, MountinfoPlacesTheHierarchies) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/docker/abc\n9:memory:/docker/abc");
  t.write("proc/self/mountinfo",
          "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
          "30 25 0:26 /docker/abc /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n"
          "41 25 0:40 /docker /cg/mem\\040v1 rw - cgroup cgroup rw,memory");
  t.write("sys/fs/cgroup/memory.max", std::to_string(kCgroupGiB / 2));
  t.write("sys/fs/cgroup/docker/abc/memory.max", "1");  // not this process's: never read
  t.write("cg/mem v1/abc/memory.limit_in_bytes", std::to_string(kCgroupGiB / 4));
  t.write("cg/mem v1/memory.limit_in_bytes", std::to_string(kCgroupGiB / 8));
  const CgroupMemory m = cgroup_memory(t.root());
  EXPECT_EQ(m.limit, kCgroupGiB / 8);
  EXPECT_EQ(m.source, "cgroup /docker (memory.limit_in_bytes)");
  std::filesystem::remove(t.path("cg/mem v1/memory.limit_in_bytes"));
  std::filesystem::remove(t.path("cg/mem v1/abc/memory.limit_in_bytes"));
  const CgroupMemory v2 = cgroup_memory(t.root());
  EXPECT_EQ(v2.limit, kCgroupGiB / 2);
  EXPECT_EQ(v2.source, "cgroup /docker/abc (memory.max)");
}

// PENTAD_CGROUP_ROOT moves "/" (the default argument reads it at each call).
TEST(Cgroup, RootFromTheEnvironment) {
  CgroupTree t;
  t.write("proc/self/cgroup", "0::/x");
  t.write("sys/fs/cgroup/x/memory.max", "123456789");
  const char* before = std::getenv("PENTAD_CGROUP_ROOT");
  const std::string saved = before ? before : "";
  setenv("PENTAD_CGROUP_ROOT", t.root().c_str(), 1);
  EXPECT_EQ(cgroup_root(), t.root());
  EXPECT_EQ(cgroup_memory().limit, 123456789);
  unsetenv("PENTAD_CGROUP_ROOT");
  EXPECT_EQ(cgroup_root(), "/");
  if (before) setenv("PENTAD_CGROUP_ROOT", saved.c_str(), 1);
}

// This machine's own cgroups, whatever they are: read without failing, and consistent.
TEST(Cgroup, ThisProcess) {
  const int affinity = affinity_cpus();
  EXPECT_GE(affinity, 1);
  const CgroupCpus c = cgroup_cpus(affinity, "/");
  EXPECT_GE(c.cpus, 1);
  EXPECT_LE(c.cpus, affinity);
  EXPECT_FALSE(c.source.empty());
  const CgroupMemory m = cgroup_memory("/");
  if (m.limit > 0) {
    EXPECT_EQ(m.source.rfind("cgroup /", 0), 0u) << m.source;
  }
  std::printf("this process: %d CPUs from %s; memory limit %lld bytes%s%s\n", c.cpus,
              c.source.c_str(), static_cast<long long>(m.limit), m.limit ? " from " : "",
              m.source.c_str());
}
