// The layout search of `pentad plan` (plan/plan_search.h): enumerate, keep what the
// existing checks accept (mesh_config: the mesh, the model split, the schedule; the
// recipe's combination checks) and what the memory plan (estimate_memory) fits, predict.
#include "plan/plan_search.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

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

// The recipe's global batch on `ranks` ranks: train.global_batch where set, else
// micro_batch x grad_accum x the dp the recipe's other degrees leave.
int64_t recipe_global_batch(const Config& recipe, int ranks) {
  const ParallelConfig& rp = recipe.parallel;
  const int64_t others = rp.tp * rp.cp * rp.pp;
  if (recipe.train.global_batch <= 0 && rp.dp <= 0 && ranks % others != 0)
    fail(
        "{}: parallel.tp x cp x pp = {} does not divide --ranks {}, so the recipe's global "
        "batch (train.micro_batch x train.grad_accum x dp) is not defined: set parallel.dp or "
        "train.global_batch",
        recipe.recipe_path, others, ranks);
  const int64_t dp0 = rp.dp > 0 ? rp.dp : ranks / others;
  return recipe.train.global_batch > 0 ? recipe.train.global_batch
                                       : recipe.train.micro_batch * recipe.train.grad_accum * dp0;
}

using Strings = std::vector<std::string>;
using Integers = std::vector<int64_t>;

// One search: the levels of the enumeration, outermost first (the degrees tp, cp, pp and the
// dp they leave; tp's 2D shape; tp order, sp and cp's implementation; the pipeline schedule;
// ZeRO; the micro-batch; ep, etp, offload and recompute), each level a method handing one
// Layout, filled in as it goes, to the next. Every level skips what the --layout fields fix
// otherwise (pick), and the bookkeeping of refusals (refuse, subtree_refused) says why when
// nothing is left.
class LayoutSearch {
 public:
  LayoutSearch(const Config& recipe, int ranks, const std::map<std::string, std::string>& fixed,
               double memory_limit_bytes, const Machine& machine,
               const parallel::Topology& topology)
      : recipe_(recipe),
        ranks_(ranks),
        fixed_(fixed),
        memory_limit_bytes_(memory_limit_bytes),
        machine_(machine),
        topology_(topology),
        global_(recipe_global_batch(recipe, ranks)),
        moe_(recipe.model.is_moe()) {
    plan_.global_batch = double(global_);
  }

  PlanSearch run(int threads) {
    search_degrees();
    search_seeds(threads);
    return finish();
  }

 private:
  // The values a field takes: the --layout one where fixed, else `values`.
  Strings pick(const char* name, Strings values) const {
    if (auto it = fixed_.find(name); it != fixed_.end()) return Strings{it->second};
    return values;
  }
  Integers picks(const char* name, const Integers& values) const {
    if (auto it = fixed_.find(name); it != fixed_.end()) return Integers{std::stoll(it->second)};
    return values;
  }
  bool fixed(const char* name) const { return fixed_.count(name) > 0; }
  int64_t fixed_integer(const char* name) const { return std::stoll(fixed_.at(name)); }

  // The first refusal met is the one a search that finds nothing names.
  void refuse(const std::string& why) {
    if (first_refusal_.empty()) first_refusal_ = why;
  }

  // A fixed degree may not divide the ranks the degrees before it leave (tp=8 leaves 96 of
  // 768 ranks; cp = 96 of them leaves 1, which pp=2 cannot split): that branch has no layout.
  bool leaves_no_layout(int64_t left, int64_t degree, const char* name) {
    if (left % degree == 0) return false;
    refuse(fmt::format("{} rank{} left for {}={}, which it does not divide", left,
                       left == 1 ? "" : "s", name, degree));
    return true;
  }

  // A subtree of choices is skipped when its first layout (the choices below at their
  // one-rank values, micro-batch 1) is refused by a message naming none of the keys chosen
  // below it: refusals name the keys they depend on, so no choice below could lift it.
  bool subtree_refused(const Layout& probe, std::initializer_list<const char*> below) {
    Config cfg = recipe_;
    probe.apply(cfg);
    try {
      recipe::check_combinations(cfg, {}, recipe_.recipe_path);
      mesh_config(cfg, ranks_);
      return false;
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const char* key : below)
        if (what.find(key) != std::string::npos) return false;
      ++plan_.pruned;
      refuse(fmt::format("{}: {}", probe.label(), what));
      return true;
    }
  }

  // A whole layout: refused by the checks, over memory, or a row with its prediction.
  void consider(const Layout& l) {
    ++plan_.considered;
    Config cfg = recipe_;
    l.apply(cfg);
    parallel::MeshConfig mesh;
    try {
      recipe::check_combinations(cfg, {}, recipe_.recipe_path);
      mesh = mesh_config(cfg, ranks_);
    } catch (const Error& e) {
      ++plan_.refused;
      refuse(fmt::format("{}: {}", l.label(), e.what()));
      return;
    }
    const double bytes = estimate_memory(cfg, mesh).total();
    if (bytes > memory_limit_bytes_) {
      ++plan_.over_memory;
      if (bytes < least_memory_) {
        least_memory_ = bytes;
        least_label_ = l.label();
      }
      return;
    }
    plan_.rows.push_back({l, predict_step(cfg, mesh, machine_, topology_)});
  }

  // tp, cp and pp over the divisors of the ranks each leaves; dp is what is left, and must
  // split the global batch.
  void search_degrees() {
    for (int64_t tp : picks("tp", layout_divisors(ranks_)))
      for (int64_t cp : picks("cp", layout_divisors(ranks_ / tp))) {
        if (leaves_no_layout(ranks_ / tp, cp, "cp")) continue;
        for (int64_t pp : picks("pp", layout_divisors(ranks_ / tp / cp))) {
          if (leaves_no_layout(ranks_ / tp / cp, pp, "pp")) continue;
          const int64_t dp = ranks_ / tp / cp / pp;
          if (fixed("dp") && fixed_integer("dp") != dp) continue;
          if (global_ % dp != 0) continue;  // the global batch must split over dp
          for (int64_t d2 : tp_shapes(tp)) {
            if (mesh_shape_refused(tp, d2, cp, pp, dp)) continue;
            Layout l;
            l.tp = tp;
            l.d2 = d2;
            l.cp = cp;
            l.pp = pp;
            l.dp = dp;
            l.tp_chunks = fixed("tp_chunks") ? fixed_integer("tp_chunks") : 1;
            l.grad_accum = global_ / dp;  // probes (below) run micro-batch 1
            if (!first_refusal_.empty() && refused_before_ < 0)
              refused_before_ = int64_t(seeds_.size());
            seeds_.push_back(l);
          }
        }
      }
  }

  // The choices inside each set of degrees, a set a task over this machine's cores (a search
  // of Megatron's 177B row on 2304 GPUs ranks millions of layouts), each into a search of its
  // own, then merged in the order one thread would have met them: the same rows, counts and
  // first refusal whatever the threads.
  void search_seeds(int threads) {
    std::vector<LayoutSearch> parts(
        seeds_.size(),
        LayoutSearch(recipe_, ranks_, fixed_, memory_limit_bytes_, machine_, topology_));
    std::vector<std::exception_ptr> errors(seeds_.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < seeds_.size(); i = next++) {
        try {
          parts[i].search_inside_degrees(seeds_[i]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < std::min(seeds_.size(), size_t(threads)); ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    // The degrees' own refusal came before the seeds from refused_before_ on.
    const std::string degrees_refusal = first_refusal_;
    first_refusal_.clear();
    for (size_t i = 0; i < seeds_.size(); ++i) {
      if (errors[i]) std::rethrow_exception(errors[i]);
      if (int64_t(i) == refused_before_) refuse(degrees_refusal);
      LayoutSearch& part = parts[i];
      refuse(part.first_refusal_);
      plan_.considered += part.plan_.considered;
      plan_.refused += part.plan_.refused;
      plan_.pruned += part.plan_.pruned;
      plan_.over_memory += part.plan_.over_memory;
      plan_.rows.insert(plan_.rows.end(), std::make_move_iterator(part.plan_.rows.begin()),
                        std::make_move_iterator(part.plan_.rows.end()));
      part.plan_.rows = {};
      if (part.least_memory_ < least_memory_) {
        least_memory_ = part.least_memory_;
        least_label_ = part.least_label_;
      }
    }
    refuse(degrees_refusal);
  }

  // tp's second dimension d2 (1: 1D): every divisor of tp, or the fixed tp_shape's.
  Integers tp_shapes(int64_t tp) {
    if (!fixed("tp_shape")) return layout_divisors(tp);
    const std::string& sh = fixed_.at("tp_shape");
    long long a = 0, b = 0;
    if (sh.empty() || std::sscanf(sh.c_str(), "%lldx%lld", &a, &b) != 2 || a < 1 || b < 1)
      fail("--layout tp_shape={}: not \"d1xd2\" with positive d1 and d2", sh);
    if (a * b != tp) {  // the shape fixes tp at d1 x d2: another tp has no layout
      refuse(fmt::format("tp_shape={} needs tp = {}", sh, a * b));
      return {};
    }
    return {b};
  }

  // The mesh's own checks of these degrees, before the choices inside them: what they
  // refuse without sequence parallelism (heads, kv heads, vocabulary, ffn width, the
  // sequence over cp, layers over pp) they refuse with any micro-batch and either sp.
  bool mesh_shape_refused(int64_t tp, int64_t d2, int64_t cp, int64_t pp, int64_t dp) {
    parallel::MeshConfig shape;
    shape.tp = int(tp);
    shape.cp = int(cp);
    shape.pp = int(pp);
    shape.dp = int(dp);
    shape.tp_d2 = int(d2);
    shape.order = recipe_.parallel.order;
    try {
      parallel::validate(shape, ranks_);
      parallel::check_layout(shape, recipe_.model.d_model, recipe_.model.n_head,
                             recipe_.model.n_kv_head, recipe_.model.vocab_size,
                             ffn_dim(recipe_.model), recipe_.model.n_layer, recipe_.train.seq_len,
                             1, false);
      return false;
    } catch (const Error& e) {
      ++plan_.pruned;
      refuse(fmt::format("tp{} cp{} pp{}: {}", tp, cp, pp, e.what()));
      return true;
    }
  }

  // Inside fixed degrees: the 2D order, sequence parallelism, cp's implementation.
  void search_inside_degrees(Layout& l) {
    const int64_t tp = l.tp, d2 = l.d2, cp = l.cp;
    for (const std::string& order :
         pick("tp_order", d2 > 1 && d2 < tp ? Strings{"row", "column"} : Strings{"row"}))
      for (const std::string& sp : pick("sp", tp > 1 ? Strings{"false", "true"} : Strings{"false"}))
        for (const std::string& cp_impl :
             pick("cp_impl", cp > 1 ? Strings{"ring", "ulysses", "hybrid"} : Strings{"ring"}))
          for (int64_t cu :
               picks("cp_ulysses", cp_impl == "hybrid" ? layout_divisors(cp) : Integers{1})) {
            if (cp_impl == "hybrid" && (cu == 1 || cu == cp)) continue;
            l.tp_order = order;
            l.sp = layout_flag(sp);
            l.cp_impl = cp_impl;
            l.cp_ulysses = cu;
            l.schedule = "1f1b", l.vp = 1, l.pp_group = 2;
            if (subtree_refused(l, kBelowContext)) continue;
            search_schedules(l);
          }
  }

  // The pipeline's schedule (with its virtual stages or group), then ZeRO.
  void search_schedules(Layout& l) {
    const int64_t pp = l.pp, dp = l.dp, cp = l.cp;
    for (const std::string& schedule :
         pick("schedule",
              pp > 1 ? Strings{"1f1b", "interleaved", "kfkb", "zb-h1", "zb-v"} : Strings{"1f1b"}))
      for (int64_t vp : picks("vp", schedule == "interleaved" ? Integers{2, 4}
                                    : schedule == "zb-v"      ? Integers{2}
                                                              : Integers{1}))
        for (int64_t group : picks("pp_group", schedule == "kfkb" ? Integers{2, 4} : Integers{2})) {
          l.schedule = schedule, l.vp = vp, l.pp_group = group;
          for (const std::string& cut : pipeline_cuts(pp * vp)) {
            l.pp_layout = cut;
            l.zero = 0;
            if (subtree_refused(l, kBelowSchedule)) continue;
            for (int64_t zero : picks("zero", dp * cp > 1 ? Integers{0, 1, 2, 3} : Integers{0})) {
              l.zero = zero;
              l.micro_batch = 1, l.grad_accum = global_ / dp;
              if (subtree_refused(l, kBelowZero)) continue;
              search_micro_batches(l);
            }
          }
        }
  }

  // The cuts of the layers into `chunks` pipeline chunks to try (Layout::pp_layout): --layout
  // cut's; the recipe's own where it names one; else the even split, and "balanced" (by FLOPs)
  // where the even split does not divide the layers (alone) or the head makes the balanced
  // cut differ.
  Strings pipeline_cuts(int64_t chunks) const {
    if (chunks == 1) return {""};
    if (fixed("cut")) return {fixed_.at("cut") == "balanced" ? "balanced" : ""};
    if (!recipe_.parallel.pp_layout.empty()) return {""};
    if (recipe_.model.n_layer % chunks != 0) return {"balanced"};
    Config balanced = recipe_;
    balanced.parallel.pp_layout = "balanced";
    balanced.parallel.virtual_stages = 1;
    const std::vector<int64_t> cut = pipeline_chunk_layers(balanced, int(chunks));
    const bool even = std::all_of(cut.begin(), cut.end(),
                                  [&](int64_t n) { return n == recipe_.model.n_layer / chunks; });
    return even ? Strings{""} : Strings{"", "balanced"};
  }

  // The micro-batch, every divisor of a dp rank's share of the global batch (grad_accum the
  // rest).
  void search_micro_batches(Layout& l) {
    const int64_t dp = l.dp;
    for (int64_t mb : picks("mb", layout_divisors(global_ / dp))) {
      const int64_t ga = global_ / dp / mb;
      if (fixed("ga") && fixed_integer("ga") != ga) {
        refuse(fmt::format(
            "mb {} x ga {} x dp {} is not the recipe's global batch of {} sequences (ga {} "
            "would be)",
            mb, fixed_integer("ga"), dp, global_, ga));
        continue;
      }
      if (global_ % (dp * mb) != 0) {
        if (!fixed("dp") && !fixed("tp") && !fixed("pp")) continue;
        fail(
            "--layout mb={}: the global batch of {} sequences over dp {} is {} a rank, which mb "
            "does not divide",
            mb, global_, dp, global_ / dp);
      }
      l.micro_batch = mb, l.grad_accum = ga;
      search_last_choices(l);
    }
  }

  // The innermost choices, each layout considered whole: experts' ep and etp, optimizer
  // offload (GPU only), recompute.
  void search_last_choices(Layout& l) {
    for (int64_t ep : picks("ep", moe_ ? layout_divisors(recipe_.model.n_experts) : Integers{1}))
      for (int64_t etp : picks("etp", moe_ ? layout_divisors(l.tp) : Integers{1}))
        for (const std::string& offload :
             pick("offload", machine_.gpu ? Strings{"none", "cpu"} : Strings{"none"}))
          for (const std::string& rc : pick("recompute", {"false", "true"})) {
            l.ep = ep, l.etp = etp, l.offload = offload;
            l.recompute = layout_flag(rc);
            consider(l);
          }
  }

  // The rows fastest first; or why there are none.
  PlanSearch finish() {
    if (plan_.rows.empty()) {
      if (plan_.considered == plan_.refused)
        fail("no layout of {} ranks passes the recipe's checks{}; one refusal: {}", ranks_,
             fixed_.empty() ? "" : " with the --layout fields given",
             first_refusal_.empty() ? "none enumerated: the global batch splits over no dp"
                                    : first_refusal_);
      fail(
          "no layout of {} ranks fits in {} a rank (--memory-gb); the smallest needs {} ({}): "
          "give more ranks or memory, or a smaller train.micro_batch or model",
          ranks_, plan_gib(memory_limit_bytes_), plan_gib(least_memory_), least_label_);
    }
    std::stable_sort(plan_.rows.begin(), plan_.rows.end(), [](const PlanRow& a, const PlanRow& b) {
      return a.prediction.step_seconds < b.prediction.step_seconds;
    });
    return std::move(plan_);
  }

  const Config& recipe_;
  const int ranks_;
  const std::map<std::string, std::string>& fixed_;
  const double memory_limit_bytes_;
  const Machine& machine_;
  const parallel::Topology& topology_;
  const int64_t global_;  // sequences per step, kept at the recipe's
  const bool moe_;
  PlanSearch plan_;
  std::string first_refusal_;
  double least_memory_ = std::numeric_limits<double>::infinity();
  std::string least_label_;
  std::vector<Layout> seeds_;    // the degrees' layouts, each searched inside (search_seeds)
  int64_t refused_before_ = -1;  // the seed the degrees' first refusal came before
};

}  // namespace

PlanSearch search_layouts(const Config& recipe, int ranks,
                          const std::map<std::string, std::string>& fixed,
                          double memory_limit_bytes, const Machine& machine,
                          const parallel::Topology& topology, int threads) {
  PENTAD_CHECK(ranks >= 1, "ranks {}", ranks);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return LayoutSearch(recipe, ranks, fixed, memory_limit_bytes, machine, topology)
      .run(threads > 0 ? threads : cores);
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
