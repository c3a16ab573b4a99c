// A layout as `pentad plan` names it (plan/plan_search.h): the --layout fields and their
// parsing, and a Layout's recipe overrides, its application to a Config and its label.
#include <cstdlib>

#include "core/check.h"
#include "plan/plan_search.h"

namespace pentad {
namespace {

struct LayoutField {
  const char* name;
  const char* key;  // the recipe key it sets
  bool degree;      // must divide --ranks
};
const LayoutField kFields[] = {
    {"tp", "parallel.tp", true},
    {"tp_shape", "parallel.tp_shape", false},
    {"tp_order", "parallel.tp_order", false},
    {"tp_chunks", "parallel.tp_chunks", false},
    {"sp", "parallel.sequence_parallel", false},
    {"cp", "parallel.cp", true},
    {"cp_impl", "parallel.cp_impl", false},
    {"cp_ulysses", "parallel.cp_ulysses", false},
    {"pp", "parallel.pp", true},
    {"schedule", "parallel.pp_schedule", false},
    {"vp", "parallel.virtual_stages", false},
    {"pp_group", "parallel.pp_group", false},
    {"cut", "parallel.pp_layout", false},
    {"dp", "parallel.dp", true},
    {"mb", "train.micro_batch", false},
    {"ga", "train.grad_accum", false},
    {"ep", "parallel.ep", true},
    {"etp", "parallel.etp", true},
    {"zero", "parallel.zero", false},
    {"offload", "parallel.offload", false},
    {"recompute", "model.recompute", false},
};

int64_t layout_integer(const std::map<std::string, std::string>& f, const char* name) {
  return std::stoll(f.at(name));
}

}  // namespace

std::string layout_fields() {
  std::string s;
  for (const LayoutField& f : kFields) s += std::string(s.empty() ? "" : ", ") + f.name;
  return s;
}

std::map<std::string, std::string> parse_layout(const std::string& spec, int ranks) {
  std::map<std::string, std::string> fixed;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      fail("--layout \"{}\": \"{}\" is not field=value (fields: {})", spec, item, layout_fields());
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    const LayoutField* field = nullptr;
    for (const LayoutField& f : kFields)
      if (name == f.name) field = &f;
    if (!field)
      fail("--layout \"{}\": unknown field \"{}\" (fields: {})", spec, name, layout_fields());
    const bool text = name == "tp_shape" || name == "tp_order" || name == "cp_impl" ||
                      name == "schedule" || name == "offload" || name == "sp" ||
                      name == "recompute" || name == "cut";
    if (name == "cut" && value != "even" && value != "balanced")
      fail(
          "--layout \"{}\": cut={} is neither even (the recipe's parallel.pp_layout, an even "
          "split where it names none) nor balanced",
          spec, value);
    if (!text) {
      char* rest = nullptr;
      const long long v = std::strtoll(value.c_str(), &rest, 10);
      if (value.empty() || *rest != '\0' || v < (name == "zero" ? 0 : 1))
        fail("--layout \"{}\": {}={} is not a{} integer", spec, name, value,
             name == "zero" ? " non-negative" : " positive");
      if (field->degree && ranks % v != 0)
        fail("--layout \"{}\": {}={} does not divide --ranks {}", spec, name, value, ranks);
    }
    fixed[name] = value;
  }
  int64_t product = 1;
  for (const char* d : {"tp", "cp", "pp", "dp"})
    if (fixed.count(d)) product *= layout_integer(fixed, d);
  if (ranks % product != 0 || (fixed.count("tp") && fixed.count("cp") && fixed.count("pp") &&
                               fixed.count("dp") && product != ranks))
    fail("--layout \"{}\": tp x cp x pp x dp = {} does not {} --ranks {}", spec, product,
         ranks % product != 0 ? "divide" : "equal", ranks);
  return fixed;
}

std::vector<std::string> Layout::overrides() const {
  std::vector<std::string> o = {
      fmt::format("parallel.tp={}", tp),
      fmt::format("parallel.tp_shape={}", d2 > 1 ? fmt::format("\"{}x{}\"", tp / d2, d2) : "\"\""),
      fmt::format("parallel.tp_order=\"{}\"", tp_order),
      fmt::format("parallel.tp_chunks={}", tp_chunks),
      fmt::format("parallel.sequence_parallel={}", sp),
      fmt::format("parallel.cp={}", cp),
      fmt::format("parallel.cp_impl=\"{}\"", cp_impl),
      fmt::format("parallel.cp_ulysses={}", cp_impl == "hybrid" ? cp_ulysses : 0),
      fmt::format("parallel.pp={}", pp),
      fmt::format("parallel.pp_schedule=\"{}\"", schedule),
      fmt::format("parallel.virtual_stages={}", vp),
      fmt::format("parallel.pp_group={}", pp_group),
      fmt::format("parallel.dp={}", dp),
      fmt::format("parallel.ep={}", ep),
      fmt::format("parallel.etp={}", etp),
      fmt::format("parallel.zero={}", zero),
      fmt::format("parallel.offload=\"{}\"", offload),
      fmt::format("model.recompute={}", recompute),
      fmt::format("train.micro_batch={}", micro_batch),
      fmt::format("train.grad_accum={}", grad_accum),
  };
  if (!pp_layout.empty())  // after pp_group
    o.insert(o.begin() + 12, fmt::format("parallel.pp_layout=\"{}\"", pp_layout));
  return o;
}

void Layout::apply(Config& c) const {
  ParallelConfig& p = c.parallel;
  p.tp = tp;
  p.tp_shape = d2 > 1 ? fmt::format("{}x{}", tp / d2, d2) : "";
  p.tp_order = tp_order;
  p.tp_chunks = tp_chunks;
  p.sequence_parallel = sp;
  p.cp = cp;
  p.cp_impl = cp_impl;
  p.cp_ulysses = cp_impl == "hybrid" ? cp_ulysses : 0;
  p.pp = pp;
  p.pp_schedule = schedule;
  p.virtual_stages = vp;
  if (!pp_layout.empty()) p.pp_layout = pp_layout;
  p.pp_group = pp_group;
  p.dp = dp;
  p.ep = ep;
  p.etp = etp;
  p.zero = zero;
  p.offload = offload;
  c.model.recompute = recompute;
  c.train.micro_batch = micro_batch;
  c.train.grad_accum = grad_accum;
}

std::string Layout::label() const {
  std::string s = fmt::format("tp{}", tp);
  if (d2 > 1) s += fmt::format(" {}x{}{}", tp / d2, d2, tp_order == "column" ? " col" : "");
  if (d2 > 1 && tp_chunks > 1) s += fmt::format(" c{}", tp_chunks);
  if (sp) s += " sp";
  if (cp > 1)
    s += fmt::format(" cp{} {}", cp,
                     cp_impl == "hybrid" ? fmt::format("hybrid{}", cp_ulysses) : cp_impl);
  if (pp > 1) {
    s += fmt::format(" pp{} {}", pp, schedule);
    if (schedule == "interleaved") s += fmt::format(" v{}", vp);
    if (schedule == "kfkb") s += fmt::format(" k{}", pp_group);
    if (pp_layout == "balanced") s += " bal";
  }
  s += fmt::format(" dp{} mb{} ga{}", dp, micro_batch, grad_accum);
  if (ep > 1 || etp > 1) s += fmt::format(" ep{} etp{}", ep, etp);
  if (zero > 0) s += fmt::format(" z{}", zero);
  if (offload != "none") s += " off:" + offload;
  if (recompute) s += " rc";
  return s;
}

}  // namespace pentad
