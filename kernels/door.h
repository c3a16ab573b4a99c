#pragma once
// The door every op of kernels/ops.h goes through, shared by the op-family files
// (linear.cpp, norms.cpp, ...; not for callers outside kernels/). An op names its tensors,
// check_args checks device and element type, the check_* helpers check shapes, and run()
// sends the call to a backend: this header is the only place that picks one.
//
// Past the door the backends differ on purpose:
//  - kernels/cpu/ kernels take raw pointers and sizes, each a template for float and for
//    double (the finite-difference tests). The door has already checked every shape and
//    picked the element type, so a kernel is only its loop over typed memory, as in llm.c:
//    no Tensor, no dtype switch and nothing left to check inside the hot loop;
//  - kernels/cuda/ kernels take Tensors and sizes (kernels/cuda/cuda_ops.h): they switch
//    between F32 and BF16 themselves (cuda/common.cuh), and their header needs no CUDA
//    header, so builds without CUDA compile every door too.
#include <cstdint>
#include <initializer_list>

#include "core/tensor.h"
#include "kernels/op_profile.h"

namespace pentad::kernels {

// True in builds with the CUDA backend. Without it the CUDA branch of run() is discarded:
// the cuda:: calls an op hands to run() are still compiled, so they cannot rot, but never
// called or linked.
#ifdef PENTAD_HAVE_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif

// A named argument of an op; the name is the parameter's, as error messages print it.
struct Arg {
  const char* name;
  const Tensor& tensor;
  // On CUDA this argument is F32 whatever the data type: per-row statistics, parameter
  // gradients, optimizer state (kernels/cuda/cuda_ops.h). On the CPU it follows the data.
  bool f32_on_cuda = false;
};

inline Arg f32_on_cuda(const char* name, const Tensor& tensor) {
  return {name, tensor, true};
}

// An empty Tensor (data == nullptr) is an absent argument.
inline bool present(const Tensor& t) {
  return t.data != nullptr;
}

// Where a call runs and the element type of its float data; the op's name and, for the ops
// that count them, the call's FLOPs, for the op profile (kernels/op_profile.h).
struct Call {
  Device device;
  DType dtype;
  const char* op = "";
  double flops = 0;
  bool cuda() const { return device == Device::CUDA; }
};

// The device of a call: every present tensor must be on the same one. A CUDA call needs a
// build with CUDA, and its tensors must point to device memory.
Device device_of(const char* op, std::initializer_list<std::initializer_list<Arg>> groups);

// Checks the arguments of a call: required tensors are present; all present tensors are on
// one device; float tensors share one dtype, F32 or F64 on the CPU, F32 or BF16 on CUDA
// (with the F32-only arguments apart); index tensors (required) are I32.
Call check_args(const char* op, std::initializer_list<Arg> required,
                std::initializer_list<Arg> optional = {}, std::initializer_list<Arg> indices = {});

// Leading dims flatten into rows: (b, t, C) and (b*t, C) are both N = b*t rows of C.
int64_t cols(const Tensor& t);
int64_t rows(const Tensor& t);

// Shape checks. Each passes over an absent tensor: check_args has already refused a missing
// required one, so only optional arguments can be absent here.
void check_matrix(const char* op, const Arg& arg, int64_t n, int64_t c);  // n rows of c
void check_shape(const char* op, const Arg& arg, const Shape& want);
void check_numel(const char* op, const Arg& arg, int64_t n);
void check_numel(const char* op, std::initializer_list<Arg> args, int64_t n);  // each of args

// An optional positions argument: absent, or I32 of shape (t) on the call's device. On the
// CPU it must also ascend (on CUDA that check would cost a copy and a wait).
void check_positions(const char* op, const Call& call, const Arg& positions, int64_t t);

// Host-side range check of I32 ids; CPU only (on CUDA it would cost a copy and a wait, and
// the kernels turn bad ids into NaN instead).
void check_indices(const char* op, const Tensor& t, int64_t limit, const char* what);

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// The FLOPs of an (n, c) by (c, oc) product, as the op profile counts a GEMM.
inline double gemm_flops(int64_t n, int64_t c, int64_t oc) {
  return 2.0 * double(n) * double(c) * double(oc);
}

// Runs a checked call on its backend: on_cuda() for a CUDA call, otherwise on_cpu(T{}) with
// T = float or double, the element type check_args found. Returns what the branch returns.
// Timed when an op profile is on (kernels/op_profile.h).
template <typename OnCuda, typename OnCpu>
decltype(auto) run(const Call& call, OnCuda&& on_cuda, OnCpu&& on_cpu) {
  const op_profile::Scope timed(call.op, call.cuda(), call.flops);
  if constexpr (kCudaBuilt) {
    if (call.cuda()) return on_cuda();
  }
  if (call.dtype == DType::F64) return on_cpu(double{});
  return on_cpu(float{});
}

}  // namespace pentad::kernels
