#include "core/cgroup.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

namespace pentad {
namespace {

namespace fs = std::filesystem;

// cgroup v1 says "no limit" with a huge value (9223372036854771712: the largest page count
// in bytes); anything from 2^60 bytes (an exbibyte) up is taken to mean that.
constexpr int64_t kCgroupNoLimit = int64_t{1} << 60;

std::string_view cgroup_trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

// The first line of a cgroup file, trimmed; nothing when the file is missing, cannot be read
// (no permission, a directory in its place) or is empty.
std::optional<std::string> cgroup_read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  const std::string_view value = cgroup_trim(line);
  if (value.empty()) return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> cgroup_parse_int(std::string_view s) {
  int64_t value = 0;
  const char* end = s.data() + s.size();
  const auto [stop, error] = std::from_chars(s.data(), end, value);
  if (error != std::errc{} || stop != end) return std::nullopt;
  return value;
}

std::vector<std::string> cgroup_split(std::string_view s, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(separator, begin), s.size());
    parts.emplace_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// mountinfo writes a space in a path as \040 (and a tab, newline, backslash alike).
std::string cgroup_unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto octal = [&](size_t j) { return j < s.size() && s[j] >= '0' && s[j] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A cgroup path without a trailing slash ("/" for the root).
std::string cgroup_normal(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path.empty() ? "/" : path;
}

bool cgroup_under(const std::string& path, const std::string& top) {
  if (path.find("/..") != std::string::npos) return false;  // outside this view of the tree
  if (top == "/") return path.front() == '/';
  return path == top || path.rfind(top + "/", 0) == 0;
}

// One mounted hierarchy that holds this process's cgroup.
struct CgroupHierarchy {
  fs::path mount;                // its mount point, under the root
  std::string mount_root = "/";  // the cgroup the mount point shows (not "/" in a container
                                 // that sees a part of the host's tree)
  std::string path;              // this process's cgroup, as /proc/self/cgroup names it
};

// Calls visit(directory, cgroup) for this process's cgroup and each one above it, up to the
// one at the mount point. A cgroup the mount does not show is skipped for its mount point.
void cgroup_walk_up(const CgroupHierarchy& h,
                    const std::function<void(const fs::path&, const std::string&)>& visit) {
  std::string path = cgroup_under(h.path, h.mount_root) ? h.path : h.mount_root;
  for (;;) {
    std::string relative = path.substr(h.mount_root == "/" ? 0 : h.mount_root.size());
    while (!relative.empty() && relative.front() == '/') relative.erase(0, 1);
    visit(relative.empty() ? h.mount : h.mount / relative, path);
    if (path == h.mount_root || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
}

struct CgroupMount {
  std::string root, point, fstype;
  std::vector<std::string> options;
};

// The cgroup mounts of <root>/proc/self/mountinfo: "36 25 0:31 / /sys/fs/cgroup/memory
// rw,nosuid - cgroup cgroup rw,memory" (optional fields may come before the "-").
std::vector<CgroupMount> cgroup_mounts(const fs::path& root) {
  std::vector<CgroupMount> mounts;
  std::ifstream in(root / "proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string word; fields >> word;) f.push_back(word);
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 3 >= f.size()) continue;
    if (f[dash + 1] != "cgroup" && f[dash + 1] != "cgroup2") continue;
    mounts.push_back({cgroup_normal(cgroup_unescape(f[3])), cgroup_unescape(f[4]), f[dash + 1],
                      cgroup_split(f[dash + 3], ',')});
  }
  return mounts;
}

// Where this process's cgroups are: its lines of /proc/self/cgroup mapped to the mounted
// hierarchies (mountinfo's, else the usual mount points under /sys/fs/cgroup).
class CgroupLayout {
 public:
  explicit CgroupLayout(const std::string& root) : root_(root.empty() ? "/" : root) {
    std::ifstream in(root_ / "proc/self/cgroup");
    std::string line;
    // "N:controller,list:/path" (v1), "0::/path" (v2); a path may hold colons itself.
    while (std::getline(in, line)) {
      const size_t first = line.find(':');
      const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
      if (second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1);
      const std::string path = cgroup_normal(std::string(cgroup_trim(line.substr(second + 1))));
      if (path.front() != '/') continue;
      if (controllers.empty())
        unified_ = path;
      else
        for (const std::string& c : cgroup_split(controllers, ',')) v1_[c] = path;
    }
    mounts_ = cgroup_mounts(root_);
  }

  // The v2 hierarchy, when this process is in one.
  std::optional<CgroupHierarchy> v2() const {
    if (!unified_) return std::nullopt;
    for (const CgroupMount& m : mounts_)
      if (m.fstype == "cgroup2") return CgroupHierarchy{under_root(m.point), m.root, *unified_};
    // A hybrid host mounts v2 at /sys/fs/cgroup/unified, a v2 host at /sys/fs/cgroup.
    const fs::path hybrid = root_ / "sys/fs/cgroup/unified";
    std::error_code error;
    const fs::path mount = fs::is_directory(hybrid, error) ? hybrid : root_ / "sys/fs/cgroup";
    return CgroupHierarchy{mount, "/", *unified_};
  }

  // The v1 hierarchy of `controller` ("memory", "cpu", "cpuset"), when one holds it.
  std::optional<CgroupHierarchy> v1(const std::string& controller) const {
    const auto line = v1_.find(controller);
    if (line == v1_.end()) return std::nullopt;
    for (const CgroupMount& m : mounts_)
      if (m.fstype == "cgroup")
        for (const std::string& option : m.options)
          if (option == controller)
            return CgroupHierarchy{under_root(m.point), m.root, line->second};
    std::vector<std::string> usual = {controller};
    if (controller == "cpu") usual = {"cpu,cpuacct", "cpuacct,cpu", "cpu"};
    fs::path mount = root_ / "sys/fs/cgroup" / usual.back();
    std::error_code error;
    for (const std::string& name : usual)
      if (fs::is_directory(root_ / "sys/fs/cgroup" / name, error)) {
        mount = root_ / "sys/fs/cgroup" / name;
        break;
      }
    return CgroupHierarchy{mount, "/", line->second};
  }

 private:
  fs::path under_root(const std::string& point) const {
    return root_ / fs::path(point).relative_path();
  }

  fs::path root_;
  std::optional<std::string> unified_;
  std::map<std::string, std::string> v1_;  // controller -> cgroup path
  std::vector<CgroupMount> mounts_;
};

// A limit and where it was found; the tightest one seen wins (the first of equals: the
// cgroup nearest the process).
struct CgroupFound {
  int64_t value = 0;
  std::string cgroup, what;
  void offer(int64_t v, const std::string& in, const std::string& file) {
    if (v <= 0 || v >= kCgroupNoLimit || (value > 0 && v >= value)) return;
    value = v;
    cgroup = in;
    what = file;
  }
  std::string source() const { return fmt::format("cgroup {} ({})", cgroup, what); }
};

std::string cgroup_cpus_text(double n) {
  return fmt::format("{:.4g} CPU{}", n, n == 1 ? "" : "s");
}

}  // namespace

std::string cgroup_root() {
  const char* root = std::getenv("PENTAD_CGROUP_ROOT");
  return root && *root ? std::string(root) : std::string("/");
}

CgroupMemory cgroup_memory(const std::string& root) {
  const CgroupLayout layout(root);
  CgroupFound limit, high;
  auto read_bytes = [](const fs::path& file) -> int64_t {
    const auto line = cgroup_read_line(file);
    if (!line || *line == "max") return 0;
    return cgroup_parse_int(*line).value_or(0);
  };
  if (const auto h = layout.v2())
    cgroup_walk_up(*h, [&](const fs::path& dir, const std::string& cgroup) {
      limit.offer(read_bytes(dir / "memory.max"), cgroup, "memory.max");
      high.offer(read_bytes(dir / "memory.high"), cgroup, "memory.high");
    });
  if (const auto h = layout.v1("memory"))
    cgroup_walk_up(*h, [&](const fs::path& dir, const std::string& cgroup) {
      for (const char* file : {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"})
        limit.offer(read_bytes(dir / file), cgroup, file);
    });
  CgroupMemory m;
  if (limit.value > 0) {
    m.limit = limit.value;
    m.source = limit.source();
  }
  if (high.value > 0) {
    m.high = high.value;
    m.high_source = high.source();
  }
  return m;
}

CgroupCpus cgroup_cpus(int affinity, const std::string& root) {
  const CgroupLayout layout(root);
  // The quota as CPUs, kept as the time per period over the period (both in microseconds).
  double quota = 0;
  std::string quota_cgroup, quota_what;
  auto offer_quota = [&](std::optional<int64_t> time, std::optional<int64_t> period,
                         const std::string& cgroup, const std::string& what) {
    if (!time || !period || *time <= 0 || *period <= 0) return;
    const double cpus = double(*time) / double(*period);
    if (quota > 0 && cpus >= quota) return;
    quota = cpus;
    quota_cgroup = cgroup;
    quota_what = what;
  };
  CgroupFound cpuset;
  auto offer_cpuset = [&](const fs::path& file, const std::string& cgroup, const char* name) {
    const auto list = cgroup_read_line(file);
    if (list) cpuset.offer(cpu_list_count(*list), cgroup, fmt::format("{} {}", name, *list));
  };
  if (const auto h = layout.v2())
    cgroup_walk_up(*h, [&](const fs::path& dir, const std::string& cgroup) {
      // "QUOTA PERIOD", or "max PERIOD" for none.
      if (const auto line = cgroup_read_line(dir / "cpu.max")) {
        const std::vector<std::string> words = cgroup_split(*line, ' ');
        if (words.size() == 2 && words[0] != "max")
          offer_quota(cgroup_parse_int(words[0]), cgroup_parse_int(words[1]), cgroup,
                      "cpu.max " + *line);
      }
      offer_cpuset(dir / "cpuset.cpus.effective", cgroup, "cpuset.cpus.effective");
    });
  if (const auto h = layout.v1("cpu"))
    cgroup_walk_up(*h, [&](const fs::path& dir, const std::string& cgroup) {
      const auto time = cgroup_read_line(dir / "cpu.cfs_quota_us");  // -1: none
      const auto period = cgroup_read_line(dir / "cpu.cfs_period_us");
      if (time && period)
        offer_quota(cgroup_parse_int(*time), cgroup_parse_int(*period), cgroup,
                    fmt::format("cpu.cfs_quota_us {} / cpu.cfs_period_us {}", *time, *period));
    });
  if (const auto h = layout.v1("cpuset"))
    cgroup_walk_up(*h, [&](const fs::path& dir, const std::string& cgroup) {
      offer_cpuset(dir / "cpuset.cpus", cgroup, "cpuset.cpus");
    });

  CgroupCpus c;
  c.affinity = std::max(0, affinity);
  if (quota > 0) {
    c.quota = quota;
    c.quota_source = fmt::format("cgroup {} ({})", quota_cgroup, quota_what);
  }
  if (cpuset.value > 0) {
    c.cpuset = int(cpuset.value);
    c.cpuset_source = cpuset.source();
  }
  // The affinity mask first: a cgroup's count names the cgroup only when it is below it.
  c.cpus = 0;
  if (c.affinity > 0) {
    c.cpus = c.affinity;
    c.source = fmt::format("the affinity mask ({})", cgroup_cpus_text(c.affinity));
  }
  if (c.cpuset > 0 && (c.cpus == 0 || c.cpuset < c.cpus)) {
    c.cpus = c.cpuset;
    c.source =
        fmt::format("cgroup {} ({} = {})", cpuset.cgroup, cpuset.what, cgroup_cpus_text(c.cpuset));
  }
  if (quota > 0) {
    const int whole = std::max(1, int(std::ceil(quota)));
    if (c.cpus == 0 || whole < c.cpus) {
      c.cpus = whole;
      c.source =
          fmt::format("cgroup {} ({} = {}{})", quota_cgroup, quota_what, cgroup_cpus_text(quota),
                      quota < 1               ? ", rounded up to 1"
                      : double(whole) > quota ? ", rounded up"
                                              : "");
    }
  }
  if (c.cpus == 0) {
    c.cpus = 1;
    c.source = "no count of CPUs found (1 assumed)";
  }
  return c;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

int cpu_list_count(std::string_view list) {
  list = cgroup_trim(list);
  if (list.empty()) return 0;
  int64_t count = 0;
  for (const std::string& item : cgroup_split(list, ',')) {
    const size_t dash = item.find('-');
    const auto first = cgroup_parse_int(std::string_view(item).substr(0, dash));
    const auto last = dash == std::string::npos
                          ? first
                          : cgroup_parse_int(std::string_view(item).substr(dash + 1));
    if (!first || !last || *first < 0 || *last < *first) return 0;
    count += *last - *first + 1;
  }
  return count > 1 << 30 ? 0 : int(count);
}

}  // namespace pentad
