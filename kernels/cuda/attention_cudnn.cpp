// Causal grouped-query attention through cuDNN's fused flash attention (scaled dot-product
// attention in the cuDNN frontend's graph API), the alternative to pentad's kernel for calls
// without positions. Host code only: the host compiler builds it (cuDNN's C++ headers are
// not for nvcc's C++17 front end to chew on) and it runs no kernel of its own besides the
// F32 <-> BF16 conversions of elementwise.cu.
//
// Layouts: pentad keeps q, out, dout, dq as (B, T, Hq, D) and k, v, dk, dv as (B, T, Hkv, D),
// contiguous; cuDNN names its dims (b, h, s, d) in that order always and takes any strides,
// so the same memory is described with strides (T*H*D, D, H*D, 1): no transposes, no copies.
// lse (B, Hq, T) F32 is cuDNN's "Stats" (b, h, s, 1), strides (Hq*T, T, 1, 1): both are the
// natural-log log-sum-exp of the scaled scores, so forward and backward may come from
// different implementations, and attention_merge reads either.
//
// Element types: cuDNN's flash attention takes BF16 (or FP16) Q, K, V, O, dO with F32
// softmax statistics and F32 accumulation. BF16 calls go straight in. F32 calls (only when
// train.attention = "cudnn" asks for them; "auto" keeps F32 on pentad's kernel) are
// converted to BF16 copies in a staging buffer and the results converted back: the one
// place where attention rounds F32 data to BF16.
//
// Graph cache: a graph is built (validated, lowered, its plan picked by heuristics and
// compiled) once per (device, direction, B, T, Hq, Hkv, D) and kept, with its workspace and
// staging memory, for the life of the process: building costs milliseconds and may
// allocate, executing it only queues work. A shape cuDNN refuses is cached as refused.
//
// Stream rule: one cuDNN handle per device, on the compute stream (cuda_ops.h), so
// cuDNN's kernels are ordered with every other kernel. No call here waits on the device
// except the first use of a shape (building and cudaMalloc).
//
// Determinism: the backward graph asks for cuDNN's deterministic algorithm (no atomics on
// dQ), so training stays bitwise reproducible for a fixed shape, as with pentad's kernel.
#define CUDNN_FRONTEND_SKIP_JSON_LIB  // pentad's nlohmann::json is Debian's; keep one copy
#include "kernels/cuda/attention_cudnn.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/device_memory.h"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

// From context.cu (declared in common.cuh, which only nvcc reads).
void check(cudaError_t rc, const char* what);
cudaStream_t stream();
void* scratch(size_t bytes);

namespace {

namespace fe = cudnn_frontend;

constexpr int kMaxDevices = 64;
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  int64_t q_numel() const { return B * T * Hq * D; }
  int64_t kv_numel() const { return B * T * Hkv * D; }
};

struct GraphKey {
  int device;
  bool backward;
  int64_t B, T, Hq, Hkv, D;
  auto tie() const { return std::tie(device, backward, B, T, Hq, Hkv, D); }
  bool operator<(const GraphKey& o) const { return tie() < o.tie(); }
};

// A built graph with the device memory its executions use. Never freed, like the scratch
// buffer (context.cu): freeing device memory from a static destructor can run after the
// CUDA runtime has shut down.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused the shape (see refusal)
  std::string refusal;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  void* staging = nullptr;  // BF16 copies for F32 calls, and dq/dk/dv for accumulation
  size_t staging_bytes = 0;
};

std::mutex cache_mutex;
int64_t graphs_built = 0;

std::map<GraphKey, Plan>& cache() {
  static std::map<GraphKey, Plan> plans;
  return plans;
}

void check_cudnn(cudnnStatus_t rc, const char* what) {
  if (rc != CUDNN_STATUS_SUCCESS) fail("cuDNN error in {}: {}", what, cudnnGetErrorString(rc));
}

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  PENTAD_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {}", device);
  return device;
}

// The handle of the current device, on the compute stream; created on first use.
cudnnHandle_t handle_of(int device) {
  static std::array<cudnnHandle_t, kMaxDevices> handles{};
  cudnnHandle_t& h = handles[static_cast<size_t>(device)];
  if (!h) {
    check_cudnn(cudnnCreate(&h), "cudnnCreate");
    check_cudnn(cudnnSetStream(h, stream()), "cudnnSetStream");
  }
  return h;
}

// (b, h, s, d) dims over pentad's (B, T, H, D) memory.
std::vector<int64_t> bhsd_dims(const Dims& d, int64_t H) {
  return {d.B, H, d.T, d.D};
}
std::vector<int64_t> bhsd_strides(const Dims& d, int64_t H) {
  return {d.T * H * d.D, d.D, H * d.D, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, const Dims& d, int64_t H) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(bhsd_dims(d, H))
                      .set_stride(bhsd_strides(d, H)));
}

void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, const Dims& d,
                int64_t H) {
  t->set_output(true).set_uid(uid).set_dim(bhsd_dims(d, H)).set_stride(bhsd_strides(d, H));
}

std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph& g, const Dims& d) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("lse")
                      .set_uid(kStats)
                      .set_dim({d.B, d.Hq, d.T, 1})
                      .set_stride({d.Hq * d.T, d.T, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Causal with the diagonal at the top left: query i sees keys 0..i (Tq == Tk here).
template <typename Attributes>
Attributes& causal(Attributes& a, const Dims& d) {
  return a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0)
      .set_attn_scale(1.0f / std::sqrt(static_cast<float>(d.D)));
}

std::shared_ptr<fe::graph::Graph> forward_graph(const Dims& d) {
  auto g = new_graph();
  auto q = input(*g, "q", kQ, d, d.Hq);
  auto k = input(*g, "k", kK, d, d.Hkv);
  auto v = input(*g, "v", kV, d, d.Hkv);
  auto attributes = fe::graph::SDPA_attributes().set_name("pentad_attention_forward");
  causal(attributes, d).set_generate_stats(true);
  auto [o, lse] = g->sdpa(q, k, v, attributes);
  set_output(o, kO, d, d.Hq);
  lse->set_output(true)
      .set_uid(kStats)
      .set_dim({d.B, d.Hq, d.T, 1})
      .set_stride({d.Hq * d.T, d.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Dims& d) {
  auto g = new_graph();
  auto q = input(*g, "q", kQ, d, d.Hq);
  auto k = input(*g, "k", kK, d, d.Hkv);
  auto v = input(*g, "v", kV, d, d.Hkv);
  auto o = input(*g, "out", kO, d, d.Hq);
  auto dout = input(*g, "dout", kDO, d, d.Hq);
  auto lse = stats_tensor(*g, d);
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("pentad_attention_backward");
  causal(attributes, d).set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, lse, attributes);
  set_output(dq, kDQ, d, d.Hq);
  set_output(dk, kDK, d, d.Hkv);  // cuDNN sums the group's query heads into each kv head
  set_output(dv, kDV, d, d.Hkv);
  return g;
}

// Lowers and compiles g; returns the empty string, or why cuDNN refused.
std::string build(fe::graph::Graph& g, cudnnHandle_t h) {
  const std::array<std::pair<const char*, std::function<fe::error_t()>>, 5> steps{{
      {"validate", [&] { return g.validate(); }},
      {"build_operation_graph", [&] { return g.build_operation_graph(h); }},
      {"create_execution_plans", [&] { return g.create_execution_plans({fe::HeurMode_t::A}); }},
      {"check_support", [&] { return g.check_support(); }},
      {"build_plans", [&] { return g.build_plans(); }},
  }};
  for (const auto& [name, step] : steps) {
    fe::error_t rc = step();
    if (!rc.is_good()) return fmt::format("{}: {}", name, rc.get_message());
  }
  return {};
}

// The staging bytes a call needs: BF16 copies of every F32 tensor it reads or writes
// (forward: q, k, v, out; backward: q, k, v, out, dout, dq, dk, dv), or for a BF16
// accumulating backward the fresh dq, dk, dv that are then added; then the F32 lse a
// forward without lse still has cuDNN write (after the BF16 part, which keeps it aligned:
// every BF16 tensor here holds a multiple of D % 8 == 0 elements).
size_t staging_bytes(const Dims& d, bool backward, DType dtype, bool accumulate, bool lse_absent) {
  const size_t q = static_cast<size_t>(d.q_numel()), kv = static_cast<size_t>(d.kv_numel());
  size_t elements = 0;
  if (dtype == DType::F32)
    elements = backward ? 4 * q + 4 * kv : 2 * q + 2 * kv;
  else if (backward && accumulate)
    elements = q + 2 * kv;
  const size_t lse_bytes = lse_absent ? static_cast<size_t>(d.B * d.Hq * d.T) * sizeof(float) : 0;
  return elements * sizeof(uint16_t) + lse_bytes;
}

// The plan of a shape, built on first use; staging grown to `staging` bytes.
Plan& plan_for(const Dims& d, bool backward) {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(cache_mutex);
  const GraphKey key{device, backward, d.B, d.T, d.Hq, d.Hkv, d.D};
  auto [it, fresh] = cache().try_emplace(key);
  Plan& plan = it->second;
  if (!fresh) return plan;
  try {
    cudnnHandle_t h = handle_of(device);
    auto g = backward ? backward_graph(d) : forward_graph(d);
    plan.refusal = build(*g, h);
    ++graphs_built;
    if (!plan.refusal.empty()) return plan;
    fe::error_t rc = g->get_workspace_size(plan.workspace_bytes);
    if (!rc.is_good()) {
      plan.refusal = fmt::format("get_workspace_size: {}", rc.get_message());
      return plan;
    }
    if (plan.workspace_bytes > 0) {
      count_device_wait();
      check(cudaMalloc(&plan.workspace, static_cast<size_t>(plan.workspace_bytes)),
            "cudaMalloc (cuDNN attention workspace)");
    }
    plan.graph = std::move(g);
  } catch (const std::exception& e) {  // no usable cuDNN here (library, driver, device)
    plan.refusal = e.what();
  }
  return plan;
}

void* staging_of(Plan& plan, size_t bytes) {
  if (bytes <= plan.staging_bytes) return plan.staging;
  // Kernels queued earlier may still read the old buffer (as scratch() in context.cu).
  count_device_wait();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (growing cuDNN staging)");
  if (plan.staging) check(cudaFree(plan.staging), "cudaFree (cuDNN staging)");
  plan.staging = nullptr;
  plan.staging_bytes = 0;
  check(cudaMalloc(&plan.staging, bytes), "cudaMalloc (cuDNN attention staging)");
  plan.staging_bytes = bytes;
  return plan.staging;
}

// Bump allocation of BF16 tensors from a staging buffer.
struct Stager {
  char* next;
  Tensor take(const Tensor& like) {
    Tensor t = like;
    t.dtype = DType::BF16;
    t.data = next;
    next += static_cast<size_t>(like.numel()) * sizeof(uint16_t);
    return t;
  }
  // A BF16 copy of an F32 input.
  Tensor copy_of(const Tensor& src) {
    Tensor t = take(src);
    convert(t, src, src.numel());
    return t;
  }
};

void execute(Plan& plan, std::unordered_map<int64_t, void*>& pack, const char* what) {
  fe::error_t rc = plan.graph->execute(handle_of(current_device()), pack, plan.workspace);
  if (!rc.is_good()) fail("{}: cuDNN execute: {}", what, rc.get_message());
}

void require_plan(const Plan& plan, const char* what) {
  if (!plan.graph) fail("{}: cuDNN refuses this shape: {}", what, plan.refusal);
}

}  // namespace

bool cudnn_attention_supported(bool backward, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                               int64_t D, std::string* why) {
  if (D % 8 != 0) {  // BF16 rows of 16-byte multiples; cuDNN would refuse at build time
    if (why) *why = fmt::format("head_dim {} is not a multiple of 8", D);
    return false;
  }
  const Plan& plan = plan_for({B, T, Hq, Hkv, D}, backward);
  if (why) *why = plan.refusal;
  return plan.graph != nullptr;
}

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t D) {
  const char* what = "cudnn_attention_forward";
  const Dims d{B, T, Hq, Hkv, D};
  Plan& plan = plan_for(d, false);
  require_plan(plan, what);
  const bool f32 = q.dtype == DType::F32;
  const bool lse_absent = lse.data == nullptr;  // optional (ops.h); cuDNN writes it anyway
  Stager stage{
      static_cast<char*>(staging_of(plan, staging_bytes(d, false, q.dtype, false, lse_absent)))};
  const Tensor q16 = f32 ? stage.copy_of(q) : q, k16 = f32 ? stage.copy_of(k) : k,
               v16 = f32 ? stage.copy_of(v) : v, o16 = f32 ? stage.take(out) : out;
  void* stats = lse_absent ? stage.next : lse.data;
  std::unordered_map<int64_t, void*> pack{
      {kQ, q16.data}, {kK, k16.data}, {kV, v16.data}, {kO, o16.data}, {kStats, stats}};
  execute(plan, pack, what);
  if (f32) convert(out, o16, out.numel());
}

void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, int64_t B, int64_t T,
                              int64_t Hq, int64_t Hkv, int64_t D, bool accumulate) {
  const char* what = "cudnn_attention_backward";
  const Dims d{B, T, Hq, Hkv, D};
  Plan& plan = plan_for(d, true);
  require_plan(plan, what);
  const bool f32 = q.dtype == DType::F32;
  Stager stage{
      static_cast<char*>(staging_of(plan, staging_bytes(d, true, q.dtype, accumulate, false)))};
  auto in = [&](const Tensor& t) { return f32 ? stage.copy_of(t) : t; };
  // cuDNN writes gradients; where they must be added, or converted, it writes to staging.
  auto grad = [&](const Tensor& t) { return f32 || accumulate ? stage.take(t) : t; };
  const Tensor q16 = in(q), k16 = in(k), v16 = in(v), o16 = in(out), do16 = in(dout);
  const Tensor dq16 = grad(dq), dk16 = grad(dk), dv16 = grad(dv);
  std::unordered_map<int64_t, void*> pack{{kQ, q16.data},   {kK, k16.data},   {kV, v16.data},
                                          {kO, o16.data},   {kDO, do16.data}, {kStats, lse.data},
                                          {kDQ, dq16.data}, {kDK, dk16.data}, {kDV, dv16.data}};
  execute(plan, pack, what);
  for (auto [dst, fresh] : {std::pair{dq, dq16}, {dk, dk16}, {dv, dv16}}) {
    if (dst.data == fresh.data) continue;
    if (!accumulate) {
      convert(dst, fresh, dst.numel());
    } else if (!f32) {
      add(dst, dst, fresh, dst.numel());
    } else {  // F32 += BF16: widen into the scratch buffer, then add
      Tensor wide = dst;
      wide.data = scratch(dst.bytes());
      convert(wide, fresh, dst.numel());
      add(dst, dst, wide, dst.numel());
    }
  }
}

int64_t cudnn_attention_graphs_built() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return graphs_built;
}

}  // namespace pentad::kernels::cuda
