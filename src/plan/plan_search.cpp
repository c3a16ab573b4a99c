// The layout search of `pentad plan` (plan/plan_search.h): enumerate, keep what the
// existing checks accept (mesh_config: the mesh, the model split, the schedule; the
// recipe's combination checks) and what the memory plan (estimate_memory) fits, predict.
#include "plan/plan_search.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "model/model.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "recipe/recipe_checks.h"

namespace pentad {
namespace {

std::vector<int64_t> layout_divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

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
bool layout_flag(const std::string& v) {
  return v == "true" || v == "1" || v == "on";
}

std::string plan_gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}

// The keys chosen below each level of the search (subtree_refused).
#define PENTAD_BELOW_ZERO                                                                     \
  "train.micro_batch", "train.grad_accum", "parallel.ep", "parallel.etp", "parallel.offload", \
      "model.recompute"
constexpr std::initializer_list<const char*> kBelowZero = {PENTAD_BELOW_ZERO};
constexpr std::initializer_list<const char*> kBelowSchedule = {PENTAD_BELOW_ZERO, "parallel.zero"};
constexpr std::initializer_list<const char*> kBelowContext = {
    PENTAD_BELOW_ZERO, "parallel.zero", "parallel.pp_schedule", "parallel.virtual_stages",
    "parallel.pp_group"};
#undef PENTAD_BELOW_ZERO

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
                      name == "recompute";
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
  }
  s += fmt::format(" dp{} mb{} ga{}", dp, micro_batch, grad_accum);
  if (ep > 1 || etp > 1) s += fmt::format(" ep{} etp{}", ep, etp);
  if (zero > 0) s += fmt::format(" z{}", zero);
  if (offload != "none") s += " off:" + offload;
  if (recompute) s += " rc";
  return s;
}

PlanSearch search_layouts(const Config& recipe, int ranks,
                          const std::map<std::string, std::string>& fixed,
                          double memory_limit_bytes, const Machine& machine,
                          const parallel::Topology& topology) {
  PENTAD_CHECK(ranks >= 1, "ranks {}", ranks);
  PlanSearch plan;
  // The recipe's global batch on `ranks` ranks: train.global_batch where set, else
  // micro_batch x grad_accum x the dp the recipe's other degrees leave.
  const ParallelConfig& rp = recipe.parallel;
  const int64_t others = rp.tp * rp.cp * rp.pp;
  if (recipe.train.global_batch <= 0 && rp.dp <= 0 && ranks % others != 0)
    fail(
        "{}: parallel.tp x cp x pp = {} does not divide --ranks {}, so the recipe's global "
        "batch (train.micro_batch x train.grad_accum x dp) is not defined: set parallel.dp or "
        "train.global_batch",
        recipe.recipe_path, others, ranks);
  const int64_t dp0 = rp.dp > 0 ? rp.dp : ranks / others;
  const int64_t global = recipe.train.global_batch > 0
                             ? recipe.train.global_batch
                             : recipe.train.micro_batch * recipe.train.grad_accum * dp0;
  plan.global_batch = double(global);

  auto pick = [&](const char* name, std::vector<std::string> values) {
    if (auto it = fixed.find(name); it != fixed.end()) return std::vector<std::string>{it->second};
    return values;
  };
  auto picks = [&](const char* name, const std::vector<int64_t>& values) {
    if (auto it = fixed.find(name); it != fixed.end())
      return std::vector<int64_t>{std::stoll(it->second)};
    return values;
  };
  const bool moe = recipe.model.is_moe();
  std::string first_refusal;
  double least_memory = std::numeric_limits<double>::infinity();
  std::string least_label;

  auto consider = [&](const Layout& l) {
    ++plan.considered;
    Config cfg = recipe;
    l.apply(cfg);
    parallel::MeshConfig mesh;
    try {
      recipe::check_combinations(cfg, {}, recipe.recipe_path);
      mesh = mesh_config(cfg, ranks);
    } catch (const Error& e) {
      ++plan.refused;
      if (first_refusal.empty()) first_refusal = fmt::format("{}: {}", l.label(), e.what());
      return;
    }
    const double bytes = estimate_memory(cfg, mesh).total();
    if (bytes > memory_limit_bytes) {
      ++plan.over_memory;
      if (bytes < least_memory) {
        least_memory = bytes;
        least_label = l.label();
      }
      return;
    }
    plan.rows.push_back({l, predict_step(cfg, mesh, machine, topology)});
  };

  // A subtree of choices is skipped when its first layout (the choices below at their
  // one-rank values, micro-batch 1) is refused by a message naming none of the keys chosen
  // below it: refusals name the keys they depend on, so no choice below could lift it.
  auto subtree_refused = [&](const Layout& probe, std::initializer_list<const char*> below) {
    Config cfg = recipe;
    probe.apply(cfg);
    try {
      recipe::check_combinations(cfg, {}, recipe.recipe_path);
      mesh_config(cfg, ranks);
      return false;
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const char* key : below)
        if (what.find(key) != std::string::npos) return false;
      ++plan.pruned;
      if (first_refusal.empty()) first_refusal = fmt::format("{}: {}", probe.label(), what);
      return true;
    }
  };

  // A fixed degree may not divide the ranks the degrees before it leave (tp=8 leaves 96 of
  // 768 ranks; cp = 96 of them leaves 1, which pp=2 cannot split): that branch has no layout.
  auto leaves_no_layout = [&](int64_t left, int64_t degree, const char* name) {
    if (left % degree == 0) return false;
    if (first_refusal.empty())
      first_refusal = fmt::format("{} rank{} left for {}={}, which it does not divide", left,
                                  left == 1 ? "" : "s", name, degree);
    return true;
  };
  for (int64_t tp : picks("tp", layout_divisors(ranks)))
    for (int64_t cp : picks("cp", layout_divisors(ranks / tp))) {
      if (leaves_no_layout(ranks / tp, cp, "cp")) continue;
      for (int64_t pp : picks("pp", layout_divisors(ranks / tp / cp))) {
        if (leaves_no_layout(ranks / tp / cp, pp, "pp")) continue;
        const int64_t dp = ranks / tp / cp / pp;
        if (fixed.count("dp") && layout_integer(fixed, "dp") != dp) continue;
        if (global % dp != 0) continue;                       // the global batch must split over dp
        std::vector<std::pair<int64_t, std::string>> shapes;  // (d2, order)
        if (fixed.count("tp_shape")) {
          const std::string& sh = fixed.at("tp_shape");
          long long a = 0, b = 0;
          if (sh.empty() || std::sscanf(sh.c_str(), "%lldx%lld", &a, &b) != 2 || a < 1 || b < 1)
            fail("--layout tp_shape={}: not \"d1xd2\" with positive d1 and d2", sh);
          if (a * b != tp) {  // the shape fixes tp at d1 x d2: another tp has no layout
            if (first_refusal.empty())
              first_refusal = fmt::format("tp_shape={} needs tp = {}", sh, a * b);
            continue;
          }
          shapes.push_back({b, "row"});
        } else {
          for (int64_t d2 : layout_divisors(tp)) shapes.push_back({d2, "row"});
        }
        for (auto [d2, order0] : shapes) {
          // The mesh's own checks of these degrees, before the choices inside them: what they
          // refuse without sequence parallelism (heads, kv heads, vocabulary, ffn width, the
          // sequence over cp, layers over pp) they refuse with any micro-batch and either sp.
          parallel::MeshConfig shape;
          shape.tp = int(tp);
          shape.cp = int(cp);
          shape.pp = int(pp);
          shape.dp = int(dp);
          shape.tp_d2 = int(d2);
          shape.order = recipe.parallel.order;
          try {
            parallel::validate(shape, ranks);
            parallel::check_layout(shape, recipe.model.d_model, recipe.model.n_head,
                                   recipe.model.n_kv_head, recipe.model.vocab_size,
                                   ffn_dim(recipe.model), recipe.model.n_layer,
                                   recipe.train.seq_len, 1, false);
          } catch (const Error& e) {
            ++plan.pruned;
            if (first_refusal.empty())
              first_refusal = fmt::format("tp{} cp{} pp{}: {}", tp, cp, pp, e.what());
            continue;
          }
          Layout l;
          l.tp = tp;
          l.d2 = d2;
          l.cp = cp;
          l.pp = pp;
          l.dp = dp;
          l.tp_chunks = fixed.count("tp_chunks") ? layout_integer(fixed, "tp_chunks") : 1;
          l.grad_accum = global / dp;  // probes (below) run micro-batch 1
          for (const std::string& order :
               pick("tp_order", d2 > 1 && d2 < tp ? std::vector<std::string>{"row", "column"}
                                                  : std::vector<std::string>{"row"}))
            for (const std::string& sp :
                 pick("sp", tp > 1 ? std::vector<std::string>{"false", "true"}
                                   : std::vector<std::string>{"false"}))
              for (const std::string& cp_impl :
                   pick("cp_impl", cp > 1 ? std::vector<std::string>{"ring", "ulysses", "hybrid"}
                                          : std::vector<std::string>{"ring"}))
                for (int64_t cu :
                     picks("cp_ulysses",
                           cp_impl == "hybrid" ? layout_divisors(cp) : std::vector<int64_t>{1})) {
                  if (cp_impl == "hybrid" && (cu == 1 || cu == cp)) continue;
                  l.tp_order = order;
                  l.sp = layout_flag(sp);
                  l.cp_impl = cp_impl;
                  l.cp_ulysses = cu;
                  l.schedule = "1f1b", l.vp = 1, l.pp_group = 2;
                  if (subtree_refused(l, kBelowContext)) continue;
                  for (const std::string& schedule :
                       pick("schedule",
                            pp > 1 ? std::vector<std::string>{"1f1b", "interleaved", "kfkb"}
                                   : std::vector<std::string>{"1f1b"}))
                    for (int64_t vp :
                         picks("vp", schedule == "interleaved" ? std::vector<int64_t>{2, 4}
                                                               : std::vector<int64_t>{1}))
                      for (int64_t group :
                           picks("pp_group", schedule == "kfkb" ? std::vector<int64_t>{2, 4}
                                                                : std::vector<int64_t>{2})) {
                        l.schedule = schedule, l.vp = vp, l.pp_group = group;
                        l.zero = 0;
                        if (subtree_refused(l, kBelowSchedule)) continue;
                        for (int64_t zero :
                             picks("zero", dp * cp > 1 ? std::vector<int64_t>{0, 1, 2, 3}
                                                       : std::vector<int64_t>{0})) {
                          l.zero = zero;
                          l.micro_batch = 1, l.grad_accum = global / dp;
                          if (subtree_refused(l, kBelowZero)) continue;
                          for (int64_t mb : picks("mb", layout_divisors(global / dp))) {
                            const int64_t ga = global / dp / mb;
                            if (fixed.count("ga") && layout_integer(fixed, "ga") != ga) {
                              if (first_refusal.empty())
                                first_refusal = fmt::format(
                                    "mb {} x ga {} x dp {} is not the recipe's global batch of {} "
                                    "sequences (ga {} would be)",
                                    mb, layout_integer(fixed, "ga"), dp, global, ga);
                              continue;
                            }
                            if (global % (dp * mb) != 0) {
                              if (!fixed.count("dp") && !fixed.count("tp") && !fixed.count("pp"))
                                continue;
                              fail(
                                  "--layout mb={}: the global batch of {} sequences over dp {} is "
                                  "{} a rank, which mb does not divide",
                                  mb, global, dp, global / dp);
                            }
                            l.micro_batch = mb, l.grad_accum = ga;
                            for (int64_t ep :
                                 picks("ep", moe ? layout_divisors(recipe.model.n_experts)
                                                 : std::vector<int64_t>{1}))
                              for (int64_t etp : picks(
                                       "etp", moe ? layout_divisors(tp) : std::vector<int64_t>{1}))
                                for (const std::string& offload :
                                     pick("offload", machine.gpu
                                                         ? std::vector<std::string>{"none", "cpu"}
                                                         : std::vector<std::string>{"none"}))
                                  for (const std::string& rc :
                                       pick("recompute", {"false", "true"})) {
                                    l.ep = ep, l.etp = etp, l.offload = offload;
                                    l.recompute = layout_flag(rc);
                                    consider(l);
                                  }
                          }
                        }
                      }
                }
        }
      }
    }
  if (plan.rows.empty()) {
    if (plan.considered == plan.refused)
      fail("no layout of {} ranks passes the recipe's checks{}; one refusal: {}", ranks,
           fixed.empty() ? "" : " with the --layout fields given",
           first_refusal.empty() ? "none enumerated: the global batch splits over no dp"
                                 : first_refusal);
    fail(
        "no layout of {} ranks fits in {} a rank (--memory-gb); the smallest needs {} ({}): "
        "give more ranks or memory, or a smaller train.micro_batch or model",
        ranks, plan_gib(memory_limit_bytes), plan_gib(least_memory), least_label);
  }
  std::stable_sort(plan.rows.begin(), plan.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    return a.prediction.step_seconds < b.prediction.step_seconds;
  });
  return plan;
}

std::string describe_plan(const PlanSearch& plan, const Machine& machine, int top) {
  const bool gpu = machine.gpu;
  std::string s = fmt::format(
      "plan: {}{}; {} layouts enumerated, {} refused by the checks (and {} groups of them "
      "refused whole), {} over memory, {} fit; global batch {} sequences\n",
      machine.name,
      machine.engine.name == "pentad" ? "" : fmt::format(", as {} runs it", machine.engine.name),
      plan.considered, plan.refused, plan.pruned, plan.over_memory, plan.rows.size(),
      plan.global_batch);
  s += fmt::format("{:>4}  {:<58} {:>10} {:>12} {:>12} {:>6} {:>10}\n", "#", "layout", "step s",
                   "tokens/s", gpu ? "TFLOP/s/dev" : "GFLOP/s/dev", "MFU", "mem/rank");
  const size_t n = std::min(plan.rows.size(), size_t(std::max(1, top)));
  for (size_t i = 0; i < n; ++i) {
    const Prediction& p = plan.rows[i].prediction;
    s +=
        fmt::format("{:>4}  {:<58} {:>10.4g} {:>12.0f} {:>12.2f} {:>5.1f}% {:>10}\n", i + 1,
                    plan.rows[i].layout.label(), p.step_seconds, p.tokens_per_second,
                    p.flops_per_device / (gpu ? 1e12 : 1e9), 100 * p.mfu, plan_gib(p.memory_bytes));
  }
  const Prediction& w = plan.rows.front().prediction;
  s += fmt::format(
      "best: compute {:.4g} s, tp {:.3g} s, cp {:.3g} s, ep {:.3g} s, bubble {:.3g} s, dp "
      "exposed {:.3g} s, optimizer {:.3g} s{}\n",
      w.compute, w.tp, w.cp, w.ep, w.bubble, w.dp, w.optimizer,
      w.oversubscription > 1
          ? fmt::format(" (each stretched {:.3g}x: ranks' threads per core)", w.oversubscription)
          : "");
  s += "best layout's recipe overrides:\n";
  for (const std::string& o : plan.rows.front().layout.overrides()) s += "  " + o + "\n";
  return s;
}

std::string plan_json(const PlanSearch& plan, const Machine& machine) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PlanRow& r : plan.rows) {
    nlohmann::json overrides = nlohmann::json::object();
    for (const std::string& o : r.layout.overrides()) {
      const size_t eq = o.find('=');
      std::string v = o.substr(eq + 1);
      if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
      overrides[o.substr(0, eq)] = v;
    }
    rows.push_back({{"layout", r.layout.label()},
                    {"overrides", overrides},
                    {"step_seconds", r.prediction.step_seconds},
                    {"tokens_per_second", r.prediction.tokens_per_second},
                    {"flops_per_device", r.prediction.flops_per_device},
                    {"mfu", r.prediction.mfu},
                    {"memory_bytes", r.prediction.memory_bytes},
                    {"parts_seconds",
                     {{"compute", r.prediction.compute},
                      {"tp", r.prediction.tp},
                      {"cp", r.prediction.cp},
                      {"ep", r.prediction.ep},
                      {"bubble", r.prediction.bubble},
                      {"dp", r.prediction.dp},
                      {"optimizer", r.prediction.optimizer}}}});
  }
  return nlohmann::json{{"machine", machine.name},
                        {"engine", machine.engine.name},
                        {"peak_flops_per_device", machine.rank_peak_flops()},
                        {"considered", plan.considered},
                        {"refused", plan.refused},
                        {"pruned_mesh_shapes", plan.pruned},
                        {"over_memory", plan.over_memory},
                        {"global_batch", plan.global_batch},
                        {"rows", rows}}
      .dump(1);
}

}  // namespace pentad
