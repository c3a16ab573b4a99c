// The backend-neutral entry points: every precondition is checked here, at the door, and
// this file is the only place that picks a backend and an element type.
#include "kernels/ops.h"

#include <cstring>
#include <initializer_list>

#include "core/device_memory.h"

#include "kernels/cpu/activations.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norms.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/vocab_parallel.h"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels {

namespace {

// The one switch between backends. In builds without CUDA the cuda:: calls below sit in
// discarded `if constexpr` branches: they are still compiled, so they cannot rot, but never
// linked.
#ifdef PENTAD_HAVE_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

struct Arg {
  const char* name;
  const Tensor& tensor;
  // On CUDA this argument is F32 whatever the data type: per-row statistics, parameter
  // gradients, optimizer state (kernels/cuda/cuda_ops.h). On the CPU it follows the data.
  bool f32_on_cuda = false;
};

Arg f32_on_cuda(const char* name, const Tensor& tensor) {
  return {name, tensor, true};
}

bool present(const Tensor& t) {
  return t.data != nullptr;
}

const char* device_label(Device device) {
  return device == Device::CPU ? "CPU" : "CUDA";
}

// The device of a call: every present tensor must be on the same one. A CUDA call needs a
// build with CUDA, and its tensors must point to device memory.
Device device_of(const char* op, std::initializer_list<std::initializer_list<Arg>> groups) {
  const Arg* first = nullptr;
  for (const auto& group : groups)
    for (const Arg& arg : group) {
      if (!present(arg.tensor)) continue;
      if (!first) {
        first = &arg;
      } else if (arg.tensor.device != first->tensor.device) {
        fail(
            "{}: '{}' is a {} tensor but '{}' is a {} tensor; the tensors of one call must be on "
            "one device",
            op, first->name, device_label(first->tensor.device), arg.name,
            device_label(arg.tensor.device));
      }
    }
  if (!first || first->tensor.device == Device::CPU) return Device::CPU;
  if constexpr (!kCudaBuilt) {
    fail(
        "{}: '{}' is a CUDA tensor, but this build has no CUDA backend (CUDA not built); "
        "rebuild with nvcc available or keep the run on the CPU",
        op, first->name);
  } else {
    for (const auto& group : groups)
      for (const Arg& arg : group)
        if (present(arg.tensor)) cuda::require_device_memory(op, arg.name, arg.tensor);
  }
  return Device::CUDA;
}

// Where a call runs and the element type of its float data.
struct Call {
  Device device;
  DType dtype;
  bool cuda() const { return device == Device::CUDA; }
};

// Checks the arguments of a call: required tensors are present; all present tensors are on
// one device; float tensors share one dtype, F32 or F64 on the CPU, F32 or BF16 on CUDA
// (with the F32-only arguments apart); index tensors (required) are I32.
Call check_args(const char* op, std::initializer_list<Arg> required,
                std::initializer_list<Arg> optional = {}, std::initializer_list<Arg> indices = {}) {
  for (const Arg& arg : required)
    PENTAD_CHECK(present(arg.tensor), "{}: '{}' is required", op, arg.name);
  for (const Arg& arg : indices)
    PENTAD_CHECK(present(arg.tensor), "{}: '{}' is required", op, arg.name);
  const Device device = device_of(op, {required, optional, indices});
  const bool cuda = device == Device::CUDA;
  const Tensor* first = nullptr;
  auto visit = [&](const Arg& arg) {
    const Tensor& t = arg.tensor;
    if (cuda && arg.f32_on_cuda) {
      PENTAD_CHECK(t.dtype == DType::F32, "{}: '{}' is {}, want f32 on CUDA", op, arg.name,
                   dtype_name(t.dtype));
      return;
    }
    if (cuda) {
      PENTAD_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16,
                   "{}: '{}' is {}, want f32 or bf16 on CUDA", op, arg.name, dtype_name(t.dtype));
    } else {
      PENTAD_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64,
                   "{}: '{}' is {}, want f32 or f64", op, arg.name, dtype_name(t.dtype));
    }
    if (!first) first = &t;
    PENTAD_CHECK(t.dtype == first->dtype, "{}: '{}' is {} but the other arguments are {}", op,
                 arg.name, dtype_name(t.dtype), dtype_name(first->dtype));
  };
  for (const Arg& arg : required) visit(arg);
  for (const Arg& arg : optional)
    if (present(arg.tensor)) visit(arg);
  for (const Arg& arg : indices)
    PENTAD_CHECK(arg.tensor.dtype == DType::I32, "{}: '{}' is {}, want i32", op, arg.name,
                 dtype_name(arg.tensor.dtype));
  return {device, first ? first->dtype : DType::F32};
}

// Leading dims flatten into rows: (b, t, C) and (b*t, C) are both N = b*t rows of C.
int64_t cols(const Tensor& t) {
  return t.shape.ndim == 0 ? 1 : t.dim(t.shape.ndim - 1);
}
int64_t rows(const Tensor& t) {
  return cols(t) == 0 ? 0 : t.numel() / cols(t);
}

void check_matrix(const char* op, const Arg& arg, int64_t n, int64_t c) {
  const Tensor& t = arg.tensor;
  PENTAD_CHECK(t.shape.ndim >= 1 && cols(t) == c && rows(t) == n,
               "{}: '{}' has shape {}, want {} rows of {}", op, arg.name, t.shape.str(), n, c);
}

void check_shape(const char* op, const Arg& arg, const Shape& want) {
  PENTAD_CHECK(arg.tensor.shape == want, "{}: '{}' has shape {}, want {}", op, arg.name,
               arg.tensor.shape.str(), want.str());
}

void check_numel(const char* op, const Arg& arg, int64_t n) {
  PENTAD_CHECK(arg.tensor.numel() == n, "{}: '{}' has shape {}, want {} elements", op, arg.name,
               arg.tensor.shape.str(), n);
}

// Host-side range check of ids; CPU only (on CUDA it would cost a copy and a wait, and the
// kernels turn bad ids into NaN instead).
void check_indices(const char* op, const Tensor& t, int64_t limit, const char* what) {
  const int32_t* idx = t.as<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    PENTAD_CHECK(idx[i] >= 0 && idx[i] < limit, "{}: {} {} at index {} is outside [0, {})", op,
                 what, idx[i], i, limit);
}

// Calls f with a value of the element type of dtype (F32 or F64, already checked).
template <typename F>
decltype(auto) dispatch(DType dtype, F&& f) {
  if (dtype == DType::F64) return f(double{});
  return f(float{});
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

}  // namespace

void linear_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const char* op = "linear_forward";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}}, {{"bias", bias}});
  PENTAD_CHECK(weight.shape.ndim == 2, "{}: weight has shape {}, want (OC, C)", op,
               weight.shape.str());
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(inp);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"out", out}, N, OC);
  if (present(bias)) check_shape(op, {"bias", bias}, {OC});
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::linear_forward(out, inp, weight, bias, N, C, OC);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::linear_forward<T>(ptr<T>(out), ptr<T>(inp), ptr<T>(weight), ptr<T>(bias), N, C, OC);
  });
}

void linear_gelu_forward(Tensor out, Tensor pre_gelu, const Tensor& inp, const Tensor& weight,
                         const Tensor& bias) {
  const char* op = "linear_gelu_forward";
  const Call call =
      check_args(op, {{"out", out}, {"pre_gelu", pre_gelu}, {"inp", inp}, {"weight", weight}},
                 {{"bias", bias}});
  PENTAD_CHECK(weight.shape.ndim == 2, "{}: weight has shape {}, want (OC, C)", op,
               weight.shape.str());
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(inp);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"out", out}, N, OC);
  check_matrix(op, {"pre_gelu", pre_gelu}, N, OC);
  if (present(bias)) check_shape(op, {"bias", bias}, {OC});
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::linear_gelu_forward(out, pre_gelu, inp, weight, bias, N, C, OC);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::linear_forward<T>(ptr<T>(pre_gelu), ptr<T>(inp), ptr<T>(weight), ptr<T>(bias), N, C, OC);
    cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(pre_gelu), N * OC);
  });
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, bool accumulate_dinp) {
  const char* op = "linear_backward";
  const Call call = check_args(
      op, {{"dout", dout}, {"weight", weight}},
      {{"dinp", dinp}, f32_on_cuda("dweight", dweight), f32_on_cuda("dbias", dbias), {"inp", inp}});
  PENTAD_CHECK(weight.shape.ndim == 2, "{}: weight has shape {}, want (OC, C)", op,
               weight.shape.str());
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(dout);
  check_matrix(op, {"dout", dout}, N, OC);
  if (present(dinp)) check_matrix(op, {"dinp", dinp}, N, C);
  if (present(dweight)) {
    PENTAD_CHECK(present(inp), "{}: 'inp' is required to compute dweight", op);
    check_shape(op, {"dweight", dweight}, weight.shape);
  }
  if (present(inp)) check_matrix(op, {"inp", inp}, N, C);
  if (present(dbias)) check_shape(op, {"dbias", dbias}, {OC});
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, accumulate_dinp);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::linear_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout), ptr<T>(inp),
                            ptr<T>(weight), N, C, OC, accumulate_dinp);
  });
}

void linear_backward_gelu(Tensor dpre_gelu, Tensor dweight, Tensor dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& pre_gelu) {
  const char* op = "linear_backward_gelu";
  const Call call = check_args(op,
                               {{"dpre_gelu", dpre_gelu},
                                {"dout", dout},
                                {"inp", inp},
                                {"weight", weight},
                                {"pre_gelu", pre_gelu}},
                               {f32_on_cuda("dweight", dweight), f32_on_cuda("dbias", dbias)});
  PENTAD_CHECK(weight.shape.ndim == 2, "{}: weight has shape {}, want (OC, C)", op,
               weight.shape.str());
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(dout);
  check_matrix(op, {"dout", dout}, N, OC);
  check_matrix(op, {"dpre_gelu", dpre_gelu}, N, C);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"pre_gelu", pre_gelu}, N, C);
  if (present(dweight)) check_shape(op, {"dweight", dweight}, weight.shape);
  if (present(dbias)) check_shape(op, {"dbias", dbias}, {OC});
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::linear_backward_gelu(dpre_gelu, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::linear_backward<T>(ptr<T>(dpre_gelu), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                            ptr<T>(inp), ptr<T>(weight), N, C, OC, false);
    cpu::gelu_backward<T>(ptr<T>(dpre_gelu), ptr<T>(dpre_gelu), ptr<T>(pre_gelu), N * C);
  });
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "layernorm_forward";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}},
                 {f32_on_cuda("mean", mean), f32_on_cuda("rstd", rstd), {"bias", bias}});
  const int64_t C = cols(inp), N = rows(inp);
  check_matrix(op, {"out", out}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(bias)) check_shape(op, {"bias", bias}, {C});
  if (present(mean)) check_numel(op, {"mean", mean}, N);
  if (present(rstd)) check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::layernorm_forward<T>(ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), ptr<T>(inp), ptr<T>(weight),
                              ptr<T>(bias), N, C, static_cast<T>(eps));
  });
}

void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, float eps) {
  const char* op = "residual_layernorm_forward";
  const Call call =
      check_args(op, {{"residual", residual}, {"out", out}, {"a", a}, {"b", b}, {"weight", weight}},
                 {f32_on_cuda("mean", mean), f32_on_cuda("rstd", rstd), {"bias", bias}});
  const int64_t C = cols(a), N = rows(a);
  check_matrix(op, {"b", b}, N, C);
  check_matrix(op, {"residual", residual}, N, C);
  check_matrix(op, {"out", out}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(bias)) check_shape(op, {"bias", bias}, {C});
  if (present(mean)) check_numel(op, {"mean", mean}, N);
  if (present(rstd)) check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, N, C, eps);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::add<T>(ptr<T>(residual), ptr<T>(a), ptr<T>(b), N * C);
    cpu::layernorm_forward<T>(ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), ptr<T>(residual),
                              ptr<T>(weight), ptr<T>(bias), N, C, static_cast<T>(eps));
  });
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const Call call =
      check_args(op,
                 {{"dout", dout},
                  {"inp", inp},
                  {"weight", weight},
                  f32_on_cuda("mean", mean),
                  f32_on_cuda("rstd", rstd)},
                 {{"dinp", dinp}, f32_on_cuda("dweight", dweight), f32_on_cuda("dbias", dbias)});
  const int64_t C = cols(inp), N = rows(inp);
  check_matrix(op, {"dout", dout}, N, C);
  if (present(dinp)) check_matrix(op, {"dinp", dinp}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(dweight)) check_shape(op, {"dweight", dweight}, {C});
  if (present(dbias)) check_shape(op, {"dbias", dbias}, {C});
  check_numel(op, {"mean", mean}, N);
  check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::layernorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                               ptr<T>(inp), ptr<T>(weight), ptr<T>(mean), ptr<T>(rstd), N, C);
  });
}

void rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& inp, const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}}, {f32_on_cuda("rstd", rstd)});
  const int64_t C = cols(inp), N = rows(inp);
  check_matrix(op, {"out", out}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(rstd)) check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::rmsnorm_forward<T>(ptr<T>(out), ptr<T>(rstd), ptr<T>(inp), ptr<T>(weight), N, C,
                            static_cast<T>(eps));
  });
}

void residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, float eps) {
  const char* op = "residual_rmsnorm_forward";
  const Call call =
      check_args(op, {{"residual", residual}, {"out", out}, {"a", a}, {"b", b}, {"weight", weight}},
                 {f32_on_cuda("rstd", rstd)});
  const int64_t C = cols(a), N = rows(a);
  check_matrix(op, {"b", b}, N, C);
  check_matrix(op, {"residual", residual}, N, C);
  check_matrix(op, {"out", out}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(rstd)) check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::residual_rmsnorm_forward(residual, out, rstd, a, b, weight, N, C, eps);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::add<T>(ptr<T>(residual), ptr<T>(a), ptr<T>(b), N * C);
    cpu::rmsnorm_forward<T>(ptr<T>(out), ptr<T>(rstd), ptr<T>(residual), ptr<T>(weight), N, C,
                            static_cast<T>(eps));
  });
}

void rmsnorm_backward(Tensor dinp, Tensor dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const Call call =
      check_args(op, {{"dout", dout}, {"inp", inp}, {"weight", weight}, f32_on_cuda("rstd", rstd)},
                 {{"dinp", dinp}, f32_on_cuda("dweight", dweight)});
  const int64_t C = cols(inp), N = rows(inp);
  check_matrix(op, {"dout", dout}, N, C);
  if (present(dinp)) check_matrix(op, {"dinp", dinp}, N, C);
  check_shape(op, {"weight", weight}, {C});
  if (present(dweight)) check_shape(op, {"dweight", dweight}, {C});
  check_numel(op, {"rstd", rstd}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::rmsnorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dout), ptr<T>(inp),
                             ptr<T>(weight), ptr<T>(rstd), N, C);
  });
}

void gelu_forward(Tensor out, const Tensor& inp) {
  const char* op = "gelu_forward";
  const Call call = check_args(op, {{"out", out}, {"inp", inp}});
  check_numel(op, {"out", out}, inp.numel());
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::gelu_forward(out, inp, inp.numel());
    return;
  }
  dispatch(call.dtype,
           [&]<typename T>(T) { cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(inp), inp.numel()); });
}

void gelu_backward(Tensor dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "gelu_backward";
  const Call call = check_args(op, {{"dinp", dinp}, {"dout", dout}, {"inp", inp}});
  check_numel(op, {"dinp", dinp}, inp.numel());
  check_numel(op, {"dout", dout}, inp.numel());
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::gelu_backward(dinp, dout, inp, inp.numel());
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::gelu_backward<T>(ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), inp.numel());
  });
}

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  const Call call = check_args(op, {{"out", out}, {"gate", gate}, {"up", up}});
  check_numel(op, {"out", out}, gate.numel());
  check_numel(op, {"up", up}, gate.numel());
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::swiglu_forward(out, gate, up, gate.numel());
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::swiglu_forward<T>(ptr<T>(out), ptr<T>(gate), ptr<T>(up), gate.numel());
  });
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  const Call call = check_args(op, {{"dout", dout}, {"gate", gate}, {"up", up}},
                               {{"dgate", dgate}, {"dup", dup}});
  const int64_t n = gate.numel();
  check_numel(op, {"dout", dout}, n);
  check_numel(op, {"up", up}, n);
  if (present(dgate)) check_numel(op, {"dgate", dgate}, n);
  if (present(dup)) check_numel(op, {"dup", dup}, n);
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::swiglu_backward(dgate, dup, dout, gate, up, n);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::swiglu_backward<T>(ptr<T>(dgate), ptr<T>(dup), ptr<T>(dout), ptr<T>(gate), ptr<T>(up), n);
  });
}

namespace {
void rope(const char* op, Tensor x, int64_t pos_offset, float theta, bool inverse) {
  const Call call = check_args(op, {{"x", x}});
  PENTAD_CHECK(x.shape.ndim == 4, "{}: x has shape {}, want (b, t, heads, head_dim)", op,
               x.shape.str());
  PENTAD_CHECK(x.dim(3) % 2 == 0, "{}: head_dim {} must be even", op, x.dim(3));
  PENTAD_CHECK(theta > 0.0f && pos_offset >= 0, "{}: theta {} and pos_offset {} must be positive",
               op, theta, pos_offset);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::rope_apply(x, x.dim(0), x.dim(1), x.dim(2), x.dim(3), pos_offset, theta, inverse);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::rope_apply<T>(ptr<T>(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3), pos_offset, theta,
                       inverse);
  });
}
}  // namespace

void rope_forward(Tensor x, int64_t pos_offset, float theta) {
  rope("rope_forward", x, pos_offset, theta, false);
}

void rope_backward(Tensor dx, int64_t pos_offset, float theta) {
  rope("rope_backward", dx, pos_offset, theta, true);
}

namespace {
struct AttentionDims {
  int64_t B, T, Hq, Hkv, D;
};

AttentionDims attention_dims(const char* op, const Call& call, const Tensor& q, const Tensor& k,
                             const Tensor& v) {
  PENTAD_CHECK(q.shape.ndim == 4, "{}: q has shape {}, want (b, t, hq, d)", op, q.shape.str());
  PENTAD_CHECK(k.shape.ndim == 4, "{}: k has shape {}, want (b, t, hkv, d)", op, k.shape.str());
  const AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  check_shape(op, {"k", k}, {d.B, d.T, d.Hkv, d.D});
  check_shape(op, {"v", v}, k.shape);
  PENTAD_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
               "{}: {} query heads are not a multiple of {} kv heads", op, d.Hq, d.Hkv);
  if (call.cuda() && (d.D < 1 || d.D > cuda::kMaxHeadDim))
    fail("{}: head_dim {} is outside [1, {}], what the CUDA attention kernels take", op, d.D,
         cuda::kMaxHeadDim);
  return d;
}
}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* op = "attention_forward";
  const Call call =
      check_args(op, {{"out", out}, {"q", q}, {"k", k}, {"v", v}}, {f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v);
  check_shape(op, {"out", out}, q.shape);
  if (present(lse)) check_shape(op, {"lse", lse}, {d.B, d.Hq, d.T});
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::attention_forward(out, lse, q, k, v, d.B, d.T, d.Hq, d.Hkv, d.D);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::attention_forward<T>(ptr<T>(out), ptr<T>(lse), ptr<T>(q), ptr<T>(k), ptr<T>(v), d.B, d.T,
                              d.Hq, d.Hkv, d.D);
  });
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_backward";
  const Call call = check_args(op, {{"dq", dq},
                                    {"dk", dk},
                                    {"dv", dv},
                                    {"dout", dout},
                                    {"q", q},
                                    {"k", k},
                                    {"v", v},
                                    {"out", out},
                                    f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v);
  check_shape(op, {"dq", dq}, q.shape);
  check_shape(op, {"dk", dk}, k.shape);
  check_shape(op, {"dv", dv}, k.shape);
  check_shape(op, {"dout", dout}, q.shape);
  check_shape(op, {"out", out}, q.shape);
  check_shape(op, {"lse", lse}, {d.B, d.Hq, d.T});
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d.B, d.T, d.Hq, d.Hkv, d.D);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::attention_backward<T>(ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<T>(dout), ptr<T>(q),
                               ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<T>(lse), d.B, d.T, d.Hq,
                               d.Hkv, d.D);
  });
}

void crossentropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                   const Tensor& targets, float dloss) {
  const char* op = "crossentropy_forward_backward";
  const Call call =
      check_args(op, {{"logits", logits}}, {f32_on_cuda("losses", losses), {"dlogits", dlogits}},
                 {{"targets", targets}});
  const int64_t V = cols(logits), N = rows(logits);
  check_numel(op, {"targets", targets}, N);
  if (present(losses)) check_numel(op, {"losses", losses}, N);
  if (present(dlogits)) check_matrix(op, {"dlogits", dlogits}, N, V);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, dloss);
    return;
  }
  check_indices(op, targets, V, "target");
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::crossentropy_forward_backward<T>(ptr<T>(losses), ptr<T>(dlogits), ptr<T>(logits),
                                          ptr<int32_t>(targets), N, V, static_cast<T>(dloss));
  });
}

void vocab_parallel_ce_max(Tensor row_max, const Tensor& logits) {
  const char* op = "vocab_parallel_ce_max";
  const Call call = check_args(op, {f32_on_cuda("row_max", row_max), {"logits", logits}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"row_max", row_max}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::vocab_parallel_ce_max(row_max, logits, N, Vl);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::vocab_parallel_ce_max<T>(ptr<T>(row_max), ptr<T>(logits), N, Vl);
  });
}

void vocab_parallel_ce_stats(Tensor stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t vocab_start) {
  const char* op = "vocab_parallel_ce_stats";
  const Call call = check_args(
      op, {f32_on_cuda("stats", stats), {"logits", logits}, f32_on_cuda("row_max", row_max)}, {},
      {{"targets", targets}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"stats", stats}, 2 * N);
  check_numel(op, {"row_max", row_max}, N);
  check_numel(op, {"targets", targets}, N);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::vocab_parallel_ce_stats(stats, logits, row_max, targets, N, Vl, vocab_start);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::vocab_parallel_ce_stats<T>(ptr<T>(stats), ptr<T>(logits), ptr<T>(row_max),
                                    ptr<int32_t>(targets), N, Vl, vocab_start);
  });
}

void vocab_parallel_ce_finish(Tensor losses, Tensor dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t vocab_start, float dloss) {
  const char* op = "vocab_parallel_ce_finish";
  const Call call = check_args(
      op, {{"logits", logits}, f32_on_cuda("row_max", row_max), f32_on_cuda("stats", stats)},
      {f32_on_cuda("losses", losses), {"dlogits", dlogits}}, {{"targets", targets}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"stats", stats}, 2 * N);
  check_numel(op, {"row_max", row_max}, N);
  check_numel(op, {"targets", targets}, N);
  if (present(losses)) check_numel(op, {"losses", losses}, N);
  if (present(dlogits)) check_matrix(op, {"dlogits", dlogits}, N, Vl);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::vocab_parallel_ce_finish(losses, dlogits, logits, row_max, stats, targets, N, Vl,
                                     vocab_start, dloss);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::vocab_parallel_ce_finish<T>(ptr<T>(losses), ptr<T>(dlogits), ptr<T>(logits),
                                     ptr<T>(row_max), ptr<T>(stats), ptr<int32_t>(targets), N, Vl,
                                     vocab_start, static_cast<T>(dloss));
  });
}

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t vocab_start) {
  const char* op = "embedding_forward";
  const Call call =
      check_args(op, {{"out", out}, {"wte", wte}}, {{"wpe", wpe}}, {{"tokens", tokens}});
  PENTAD_CHECK(tokens.shape.ndim == 2, "{}: tokens has shape {}, want (b, t)", op,
               tokens.shape.str());
  PENTAD_CHECK(wte.shape.ndim == 2, "{}: wte has shape {}, want (V, C)", op, wte.shape.str());
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), V = wte.dim(0), C = wte.dim(1);
  check_shape(op, {"out", out}, {B, T_, C});
  if (present(wpe)) {
    PENTAD_CHECK(wpe.shape.ndim == 2 && wpe.dim(1) == C && wpe.dim(0) >= T_,
                 "{}: wpe has shape {}, want (>= {}, {})", op, wpe.shape.str(), T_, C);
  }
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::embedding_forward(out, tokens, wte, wpe, B, T_, C, V, vocab_start);
    return;
  }
  if (vocab_start < 0) check_indices(op, tokens, V, "token");
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::embedding_forward<T>(ptr<T>(out), ptr<int32_t>(tokens), ptr<T>(wte), ptr<T>(wpe), B, T_, C,
                              std::max<int64_t>(vocab_start, 0), V);
  });
}

void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t vocab_start) {
  const char* op = "embedding_backward";
  const Call call =
      check_args(op, {{"dout", dout}}, {f32_on_cuda("dwte", dwte), f32_on_cuda("dwpe", dwpe)},
                 {{"tokens", tokens}});
  PENTAD_CHECK(tokens.shape.ndim == 2, "{}: tokens has shape {}, want (b, t)", op,
               tokens.shape.str());
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), C = cols(dout);
  check_shape(op, {"dout", dout}, {B, T_, C});
  if (present(dwte)) {
    PENTAD_CHECK(dwte.shape.ndim == 2 && dwte.dim(1) == C, "{}: dwte has shape {}, want (V, {})",
                 op, dwte.shape.str(), C);
    if (vocab_start < 0 && !call.cuda()) check_indices(op, tokens, dwte.dim(0), "token");
  }
  if (present(dwpe)) {
    PENTAD_CHECK(dwpe.shape.ndim == 2 && dwpe.dim(1) == C && dwpe.dim(0) >= T_,
                 "{}: dwpe has shape {}, want (>= {}, {})", op, dwpe.shape.str(), T_, C);
  }
  const int64_t V = present(dwte) ? dwte.dim(0) : 0;
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T_, C, V, vocab_start);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::embedding_backward<T>(ptr<T>(dwte), ptr<T>(dwpe), ptr<T>(dout), ptr<int32_t>(tokens), B,
                               T_, C, std::max<int64_t>(vocab_start, 0), V);
  });
}

void add(Tensor out, const Tensor& a, const Tensor& b) {
  const char* op = "add";
  const Call call = check_args(op, {{"out", out}, {"a", a}, {"b", b}});
  check_numel(op, {"b", b}, a.numel());
  check_numel(op, {"out", out}, a.numel());
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::add(out, a, b, a.numel());
    return;
  }
  dispatch(call.dtype,
           [&]<typename T>(T) { cpu::add<T>(ptr<T>(out), ptr<T>(a), ptr<T>(b), a.numel()); });
}

void zero(Tensor x) {
  const Call call = check_args("zero", {{"x", x}});
  if (call.cuda())
    device_zero(x.data, x.bytes());
  else
    std::memset(x.data, 0, x.bytes());
}

void scale(Tensor x, float s) {
  const Call call = check_args("scale", {{"x", x}});
  if (call.cuda()) {
    if constexpr (kCudaBuilt) cuda::scale(x, s, x.numel());
    return;
  }
  dispatch(call.dtype,
           [&]<typename T>(T) { cpu::scale<T>(ptr<T>(x), static_cast<T>(s), x.numel()); });
}

double sum_squares(const Tensor& x) {
  const Call call = check_args("sum_squares", {{"x", x}});
  if (call.cuda()) {
    if constexpr (kCudaBuilt) return cuda::sum_squares(x, x.numel());
    return 0.0;
  }
  return dispatch(call.dtype,
                  [&]<typename T>(T) { return cpu::sum_squares<T>(ptr<T>(x), x.numel()); });
}

void convert(Tensor out, const Tensor& inp) {
  const char* op = "convert";
  PENTAD_CHECK(present(out) && present(inp), "{}: 'out' and 'inp' are required", op);
  const Device device = device_of(op, {{{"out", out}, {"inp", inp}}});
  for (const Arg& arg : {Arg{"out", out}, Arg{"inp", inp}}) {
    const DType dt = arg.tensor.dtype;
    const bool ok =
        dt == DType::F32 || dt == DType::BF16 || (dt == DType::F64 && device == Device::CPU);
    PENTAD_CHECK(ok, "{}: '{}' is {}, want f32, bf16{}", op, arg.name, dtype_name(dt),
                 device == Device::CPU ? " or f64" : " (on CUDA)");
  }
  check_numel(op, {"out", out}, inp.numel());
  if (device == Device::CUDA) {
    if constexpr (kCudaBuilt) cuda::convert(out, inp, inp.numel());
    return;
  }
  cpu::convert(out.data, out.dtype, inp.data, inp.dtype, inp.numel());
}

void adamw_update(Tensor params, Tensor m, Tensor v, const Tensor& grads, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step) {
  const char* op = "adamw_update";
  const Call call = check_args(op, {f32_on_cuda("params", params), f32_on_cuda("m", m),
                                    f32_on_cuda("v", v), f32_on_cuda("grads", grads)});
  const int64_t n = params.numel();
  check_numel(op, {"m", m}, n);
  check_numel(op, {"v", v}, n);
  check_numel(op, {"grads", grads}, n);
  PENTAD_CHECK(step >= 1, "{}: step counts from 1, got {}", op, step);
  if (call.cuda()) {
    if constexpr (kCudaBuilt)
      cuda::adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, step);
    return;
  }
  dispatch(call.dtype, [&]<typename T>(T) {
    cpu::adamw_update<T>(ptr<T>(params), ptr<T>(m), ptr<T>(v), ptr<T>(grads), n, lr, beta1, beta2,
                         eps, weight_decay, step);
  });
}

}  // namespace pentad::kernels
