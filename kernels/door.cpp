// The shared argument checks of kernels/door.h.
#include "kernels/door.h"

#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels {

namespace {

const char* device_label(Device device) {
  return device == Device::CPU ? "CPU" : "CUDA";
}

}  // namespace

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

Call check_args(const char* op, std::initializer_list<Arg> required,
                std::initializer_list<Arg> optional, std::initializer_list<Arg> indices) {
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
  return {device, first ? first->dtype : DType::F32, op};
}

int64_t cols(const Tensor& t) {
  return t.shape.ndim == 0 ? 1 : t.dim(t.shape.ndim - 1);
}

int64_t rows(const Tensor& t) {
  return cols(t) == 0 ? 0 : t.numel() / cols(t);
}

void check_matrix(const char* op, const Arg& arg, int64_t n, int64_t c) {
  const Tensor& t = arg.tensor;
  if (!present(t)) return;
  PENTAD_CHECK(t.shape.ndim >= 1 && cols(t) == c && rows(t) == n,
               "{}: '{}' has shape {}, want {} rows of {}", op, arg.name, t.shape.str(), n, c);
}

void check_shape(const char* op, const Arg& arg, const Shape& want) {
  if (!present(arg.tensor)) return;
  PENTAD_CHECK(arg.tensor.shape == want, "{}: '{}' has shape {}, want {}", op, arg.name,
               arg.tensor.shape.str(), want.str());
}

void check_numel(const char* op, const Arg& arg, int64_t n) {
  if (!present(arg.tensor)) return;
  PENTAD_CHECK(arg.tensor.numel() == n, "{}: '{}' has shape {}, want {} elements", op, arg.name,
               arg.tensor.shape.str(), n);
}

void check_numel(const char* op, std::initializer_list<Arg> args, int64_t n) {
  for (const Arg& arg : args) check_numel(op, arg, n);
}

void check_positions(const char* op, const Call& call, const Arg& positions, int64_t t) {
  const Tensor& p = positions.tensor;
  if (!present(p)) return;
  PENTAD_CHECK(p.dtype == DType::I32, "{}: '{}' is {}, want i32", op, positions.name,
               dtype_name(p.dtype));
  PENTAD_CHECK(p.shape == Shape{t}, "{}: '{}' has shape {}, want ({})", op, positions.name,
               p.shape.str(), t);
  PENTAD_CHECK(p.device == call.device,
               "{}: '{}' is a {} tensor but the data is on {}; positions live on the compute "
               "device",
               op, positions.name, device_label(p.device), device_label(call.device));
  if constexpr (kCudaBuilt) {
    if (call.cuda()) cuda::require_device_memory(op, positions.name, p);
  }
  if (call.cuda()) return;
  const int32_t* pos = p.as<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    PENTAD_CHECK(pos[i] >= 0, "{}: '{}' holds {} at index {}, want positions >= 0", op,
                 positions.name, pos[i], i);
    PENTAD_CHECK(i == 0 || pos[i] >= pos[i - 1],
                 "{}: '{}' is not ascending: {} at index {} follows {}", op, positions.name, pos[i],
                 i, pos[i - 1]);
  }
}

void check_indices(const char* op, const Tensor& t, int64_t limit, const char* what) {
  const int32_t* idx = t.as<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    PENTAD_CHECK(idx[i] >= 0 && idx[i] < limit, "{}: {} {} at index {} is outside [0, {})", op,
                 what, idx[i], i, limit);
}

}  // namespace pentad::kernels
