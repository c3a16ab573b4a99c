#include "parallel/mesh.h"

#include <fmt/ranges.h>

#include <array>
#include <string_view>
#include <vector>

#include "parallel/backend.h"

namespace pentad::parallel {
namespace {

constexpr std::array<Axis, 4> kDenseAxes = {Axis::TP, Axis::CP, Axis::DP, Axis::PP};

// The four dense axes, innermost first. `config` has passed validate().
std::array<Axis, 4> parse_order(const std::string& order) {
  std::array<Axis, 4> axes{};
  std::array<bool, 4> seen{};
  size_t count = 0;
  size_t begin = 0;
  while (begin <= order.size()) {
    size_t end = order.find(',', begin);
    if (end == std::string::npos) end = order.size();
    std::string_view token(order.data() + begin, end - begin);
    while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
    while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
    int found = -1;
    for (int i = 0; i < 4; ++i)
      if (token == axis_name(kDenseAxes[size_t(i)])) found = i;
    if (found < 0)
      fail(
          "mesh order \"{}\": unknown axis '{}': list tp, cp, dp and pp once each, innermost "
          "first (e.g. \"tp,cp,dp,pp\"); ep and etp are placed by the expert view",
          order, token);
    if (seen[size_t(found)])
      fail("mesh order \"{}\" names {} twice: list tp, cp, dp and pp once each", order, token);
    seen[size_t(found)] = true;
    if (count < 4) axes[count] = kDenseAxes[size_t(found)];
    ++count;
    begin = end + 1;
  }
  for (int i = 0; i < 4; ++i)
    if (!seen[size_t(i)])
      fail("mesh order \"{}\" leaves out {}: list tp, cp, dp and pp once each", order,
           axis_name(kDenseAxes[size_t(i)]));
  return axes;
}

std::string divisors_hint(int64_t n) {
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) divisors.push_back(d);
  if (divisors.size() > 12) return fmt::format("a divisor of {}", n);
  return fmt::format("a divisor of {} ({})", n, fmt::join(divisors, ", "));
}

// Communicator over the ranks with equal `color`, ordered by `key` (the world rank).
std::unique_ptr<Communicator> split(MPI_Comm world, int color, int key, Backend backend,
                                    const std::string& name) {
  MPI_Comm part = MPI_COMM_NULL;
  const int rc = MPI_Comm_split(world, color, key, &part);
  if (rc != MPI_SUCCESS)
    fail_with_trace(fmt::format("MPI_Comm_split for mesh group {} failed", name));
  if (part == MPI_COMM_NULL) return nullptr;  // color MPI_UNDEFINED: not a member
  std::unique_ptr<Communicator> comm = make_communicator(backend, part, name);
  MPI_Comm_free(&part);
  return comm;
}

}  // namespace

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::TP:
      return "tp";
    case Axis::CP:
      return "cp";
    case Axis::DP:
      return "dp";
    case Axis::PP:
      return "pp";
    case Axis::EP:
      return "ep";
    case Axis::ETP:
      return "etp";
    case Axis::EDP:
      return "edp";
  }
  return "?";
}

void validate(const MeshConfig& c, int world_size) {
  const std::array<std::pair<const char*, int>, 6> degrees = {
      {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}, {"ep", c.ep}, {"etp", c.etp}}};
  for (const auto& [name, value] : degrees)
    if (value < 1)
      fail("mesh: {} is {} but every degree must be at least 1: set {} to 1 or more", name, value,
           name);
  parse_order(c.order);
  if (c.tp_d2 < 1 || c.tp % c.tp_d2 != 0)
    fail(
        "mesh: the 2D tp shape {}x{} does not multiply to tp {}: set parallel.tp_shape to "
        "\"d1xd2\" with d2 {}",
        c.tp_d2 >= 1 ? c.tp / c.tp_d2 : 0, c.tp_d2, c.tp, divisors_hint(c.tp));
  if (c.cp_ulysses < 1 || c.cp % c.cp_ulysses != 0)
    fail("mesh: the Ulysses degree {} does not divide cp {}: set parallel.cp_ulysses to {}",
         c.cp_ulysses, c.cp, divisors_hint(c.cp));

  const int64_t ranks = int64_t(c.tp) * c.cp * c.dp * c.pp;
  if (ranks != world_size) {
    const int64_t others = int64_t(c.tp) * c.cp * c.pp;
    const std::string change =
        world_size % others == 0 ? fmt::format("change dp to {} or ", world_size / others) : "";
    fail("tp {} × cp {} × dp {} × pp {} = {} ranks but {} were started: {}start {} ranks", c.tp,
         c.cp, c.dp, c.pp, ranks, world_size, change, ranks);
  }
  const int64_t stage = int64_t(c.dp) * c.cp * c.tp;
  const int64_t expert = int64_t(c.ep) * c.etp;
  if (stage % expert != 0) {
    const std::string change = stage % c.etp == 0
                                   ? fmt::format("change ep to {}", divisors_hint(stage / c.etp))
                                   : fmt::format("change etp to {}", divisors_hint(stage));
    fail(
        "ep {} × etp {} = {} does not divide the {} ranks of a pipeline stage (dp {} × cp {} × "
        "tp {}): {}",
        c.ep, c.etp, expert, stage, c.dp, c.cp, c.tp, change);
  }
}

void check_layout(const MeshConfig& c, int64_t d_model, int64_t n_head, int64_t n_kv_head,
                  int64_t vocab_size, int64_t ffn_dim, int64_t n_layer, int64_t seq_len,
                  int64_t micro_batch, bool sequence_parallel) {
  const int64_t kv_heads = n_kv_head > 0 ? n_kv_head : n_head;
  // Heads and the MLP width split over d1 (all of tp in 1D).
  const int d1 = c.tp / c.tp_d2;
  auto tp_divides = [&](int64_t n, const char* key) {
    if (n % d1 == 0) return;
    if (c.tp_d2 == 1)
      fail("tp {} does not divide {} = {}: change tp to {}", c.tp, key, n, divisors_hint(n));
    fail(
        "the 2D tp shape {}x{} splits {} = {} over d1 = {}, which does not divide it: change "
        "parallel.tp_shape so that d1 is {}",
        d1, c.tp_d2, key, n, d1, divisors_hint(n));
  };
  tp_divides(n_head, "model.n_head");
  tp_divides(kv_heads, "model.n_kv_head");
  if (vocab_size % c.tp != 0)
    fail(
        "tp {} does not divide model.vocab_size = {}: pad model.vocab_size to a multiple of {} "
        "(e.g. {}) or change tp to {}",
        c.tp, vocab_size, c.tp, (vocab_size + c.tp - 1) / c.tp * c.tp, divisors_hint(vocab_size));
  tp_divides(ffn_dim, "model.d_ff");
  if (d_model % c.tp_d2 != 0)
    fail(
        "the 2D tp shape {}x{} splits model.d_model = {} over d2 = {}, which does not divide "
        "it: change parallel.tp_shape so that d2 is {}",
        d1, c.tp_d2, d_model, c.tp_d2, divisors_hint(d_model));
  if (sequence_parallel && (micro_batch * seq_len) % c.tp != 0)
    fail(
        "with sequence parallelism tp {} must divide train.micro_batch × train.seq_len = {} × {} "
        "= {}: change tp to {} or change train.seq_len",
        c.tp, micro_batch, seq_len, micro_batch * seq_len, divisors_hint(micro_batch * seq_len));
  if (seq_len % c.cp != 0)
    fail(
        "cp {} does not divide train.seq_len = {}: change cp to {} or train.seq_len to a "
        "multiple of {}",
        c.cp, seq_len, divisors_hint(seq_len), c.cp);
  if (c.pp > n_layer)
    fail(
        "pp {} is more than model.n_layer = {}: every pipeline stage needs a layer; change pp to "
        "at most {}",
        c.pp, n_layer, n_layer);
}

int mesh_degree(const MeshConfig& c, Axis axis) {
  switch (axis) {
    case Axis::TP:
      return c.tp;
    case Axis::CP:
      return c.cp;
    case Axis::DP:
      return c.dp;
    case Axis::PP:
      return c.pp;
    case Axis::EP:
      return c.ep;
    case Axis::ETP:
      return c.etp;
    case Axis::EDP:
      return c.dp * c.cp * c.tp / (c.ep * c.etp);
  }
  return 1;
}

MeshCoords mesh_coords(const MeshConfig& c, int world_rank) {
  MeshCoords coords{};
  int rest = world_rank;
  int stage_index = 0, stage_stride = 1;  // rank within the pp stage, pp left out
  for (Axis axis : parse_order(c.order)) {
    const int degree = mesh_degree(c, axis);
    const int coord = rest % degree;
    rest /= degree;
    coords.at(size_t(axis)) = coord;  // at(): GCC 12 cannot see axis is dense
    if (axis != Axis::PP) {
      stage_index += coord * stage_stride;
      stage_stride *= degree;
    }
  }
  coords[size_t(Axis::ETP)] = stage_index % c.etp;
  coords[size_t(Axis::EP)] = stage_index / c.etp % c.ep;
  coords[size_t(Axis::EDP)] = stage_index / (c.etp * c.ep);
  return coords;
}

int mesh_rank(const MeshConfig& c, int tp, int cp, int dp, int pp) {
  MeshCoords coords{};
  coords[size_t(Axis::TP)] = tp;
  coords[size_t(Axis::CP)] = cp;
  coords[size_t(Axis::DP)] = dp;
  coords[size_t(Axis::PP)] = pp;
  int rank = 0, stride = 1;
  for (Axis axis : parse_order(c.order)) {
    rank += coords[size_t(axis)] * stride;
    stride *= mesh_degree(c, axis);
  }
  return rank;
}

TpPlace tp_place(const MeshConfig& c, int t) {
  const int d2 = c.tp_d2, d1 = c.tp / d2;
  return c.tp_column_first ? TpPlace{t % d1, t / d1} : TpPlace{t / d2, t % d2};
}

Mesh Mesh::create(const MeshConfig& config, MPI_Comm world, Backend backend) {
  Mesh mesh;
  MPI_Comm_rank(world, &mesh.world_rank_);
  MPI_Comm_size(world, &mesh.world_size_);
  validate(config, mesh.world_size_);
  mesh.config_ = config;
  const MeshCoords& x = mesh.coords_ = mesh_coords(config, mesh.world_rank_);
  auto at = [&](Axis a) { return x[size_t(a)]; };
  const int pp = at(Axis::PP);

  // Color = the coordinates a group shares, as one number; key = world rank, so a
  // group's rank order is its free coordinate (or, for dp_cp, the order's nesting).
  const int stage_size = config.dp * config.cp * config.tp;
  auto expert_color = [&](Axis free) {
    MeshCoords y = x;
    y[size_t(free)] = 0;
    const int index = y[size_t(Axis::ETP)] +
                      config.etp * (y[size_t(Axis::EP)] + config.ep * y[size_t(Axis::EDP)]);
    return pp * stage_size + index;
  };
  for (Axis axis : kDenseAxes) {
    MeshCoords y = x;
    y[size_t(axis)] = 0;
    const int color = mesh_rank(config, y[0], y[1], y[2], y[3]);
    mesh.groups_[size_t(axis)] = split(world, color, mesh.world_rank_, backend, axis_name(axis));
  }
  for (Axis axis : {Axis::EP, Axis::ETP, Axis::EDP})
    mesh.groups_[size_t(axis)] =
        split(world, expert_color(axis), mesh.world_rank_, backend, axis_name(axis));
  mesh.dp_cp_ =
      split(world, mesh_rank(config, at(Axis::TP), 0, 0, pp), mesh.world_rank_, backend, "dp_cp");
  // Tied embeddings under pipelining: the first and last stages hold the same table (one
  // stage holds both ends in a V).
  const bool ends = config.pp > 1 && !config.pp_vee && (pp == 0 || pp == config.pp - 1);
  mesh.embedding_ = split(
      world, ends ? mesh_rank(config, at(Axis::TP), at(Axis::CP), at(Axis::DP), 0) : MPI_UNDEFINED,
      mesh.world_rank_, backend, "embedding");
  mesh.expert_model_ =
      split(world, pp * stage_size + at(Axis::EDP), mesh.world_rank_, backend, "ep_etp");
  // A hybrid's Ulysses groups (consecutive cp coordinates) and ring groups (strided).
  const int U = config.cp_ulysses, c = at(Axis::CP);
  if (U > 1 && U < config.cp) {
    mesh.cp_ulysses_ = split(world, mesh_rank(config, at(Axis::TP), c / U * U, at(Axis::DP), pp),
                             mesh.world_rank_, backend, "cp_ulysses");
    mesh.cp_ring_ = split(world, mesh_rank(config, at(Axis::TP), c % U, at(Axis::DP), pp),
                          mesh.world_rank_, backend, "cp_ring");
  }
  // 2D tp: one color per tp group (its tp-0 rank), refined by the shared mesh index.
  if (config.tp_d2 > 1) {
    const int d1 = config.tp / config.tp_d2, d2 = config.tp_d2;
    const int base = mesh_rank(config, 0, at(Axis::CP), at(Axis::DP), pp);
    const TpPlace me = tp_place(config, at(Axis::TP));
    mesh.tp_all_ = split(world, base, me.logical(d2), backend, "tp_all");
    mesh.tp_heads_ = split(world, base * d2 + me.j, me.i, backend, "tp_heads");
    mesh.tp_hidden_ = split(world, base * d1 + me.i, me.j, backend, "tp_hidden");
  }
  mesh.world_ = make_communicator(backend, world, "world");
  return mesh;
}

Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;
Mesh::~Mesh() = default;

Communicator& Mesh::group(Axis axis) {
  return *groups_[size_t(axis)];
}
Communicator& Mesh::dp_cp() {
  return *dp_cp_;
}
Communicator& Mesh::expert_model() {
  return *expert_model_;
}
Communicator* Mesh::cp_ulysses() {
  if (config_.cp_ulysses <= 1) return nullptr;
  return config_.cp_ulysses == config_.cp ? &group(Axis::CP) : cp_ulysses_.get();
}
Communicator* Mesh::cp_ring() {
  if (config_.cp_ulysses >= config_.cp) return nullptr;
  return config_.cp_ulysses == 1 ? &group(Axis::CP) : cp_ring_.get();
}
Communicator* Mesh::embedding_group() {
  return embedding_.get();
}
Communicator* Mesh::tp_all() {
  return tp_all_.get();
}
Communicator* Mesh::tp_heads() {
  return tp_heads_.get();
}
Communicator* Mesh::tp_hidden() {
  return tp_hidden_.get();
}
Communicator& Mesh::world() {
  return *world_;
}

std::string Mesh::describe() const {
  std::string text = fmt::format("rank {}:", world_rank_);
  const std::array<Axis, 4> order = parse_order(config_.order);
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    text += fmt::format(" {} {}/{}", axis_name(*it), coord(*it), degree(*it));
  text += " |";
  for (Axis axis : {Axis::EP, Axis::ETP, Axis::EDP})
    text += fmt::format(" {} {}/{}", axis_name(axis), coord(axis), degree(axis));
  return text;
}

}  // namespace pentad::parallel
