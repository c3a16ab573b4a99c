// The doors of the elementwise utilities (kernels/ops.h): add, zero, scale, sum of squares
// and element-type conversion.
#include "kernels/cpu/elementwise.h"

#include <cstring>

#include "core/device_memory.h"
#include "kernels/cpu/convert.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

void add(Tensor out, const Tensor& a, const Tensor& b) {
  const char* op = "add";
  const Call call = check_args(op, {{"out", out}, {"a", a}, {"b", b}});
  const int64_t n = a.numel();
  check_numel(op, {{"b", b}, {"out", out}}, n);
  run(
      call, [&] { cuda::add(out, a, b, n); },
      [&]<typename T>(T) { cpu::add<T>(ptr<T>(out), ptr<T>(a), ptr<T>(b), n); });
}

void zero(Tensor x) {
  const Call call = check_args("zero", {{"x", x}});
  run(
      call, [&] { device_zero(x.data, x.bytes()); },
      [&](auto) { std::memset(x.data, 0, x.bytes()); });
}

void scale(Tensor x, float s) {
  const Call call = check_args("scale", {{"x", x}});
  run(
      call, [&] { cuda::scale(x, s, x.numel()); },
      [&]<typename T>(T) { cpu::scale<T>(ptr<T>(x), static_cast<T>(s), x.numel()); });
}

double sum_squares(const Tensor& x) {
  const Call call = check_args("sum_squares", {{"x", x}});
  return run(
      call, [&] { return cuda::sum_squares(x, x.numel()); },
      [&]<typename T>(T) { return cpu::sum_squares<T>(ptr<T>(x), x.numel()); });
}

namespace {

void sum_into(const char* op, Tensor total, const Tensor& x, double scale, bool squares) {
  const Call call = check_args(op, {{"x", x}});
  PENTAD_CHECK(
      total.data && total.dtype == DType::F64 && total.numel() == 1 && total.device == call.device,
      "{}: total must be one F64 on {}, got {} {} on {}", op, device_name(call.device),
      dtype_name(total.dtype), total.shape.str(), device_name(total.device));
  run(
      call, [&] { cuda::sum_into(total, x, x.numel(), scale, squares); },
      [&]<typename T>(T) {
        *ptr<double>(total) += squares ? cpu::sum_squares<T>(ptr<T>(x), x.numel())
                                       : scale * cpu::sum<T>(ptr<T>(x), x.numel());
      });
}

}  // namespace

void sum_into(Tensor total, const Tensor& x, double scale) {
  sum_into("sum_into", total, x, scale, false);
}

void sum_squares_into(Tensor total, const Tensor& x) {
  sum_into("sum_squares_into", total, x, 1.0, true);
}

void convert(Tensor out, const Tensor& inp) {
  const char* op = "convert";
  PENTAD_CHECK(present(out) && present(inp), "{}: 'out' and 'inp' are required", op);
  // Not check_args: the two sides of a conversion differ in element type by design.
  const Device device = device_of(op, {{{"out", out}, {"inp", inp}}});
  for (const Arg& arg : {Arg{"out", out}, Arg{"inp", inp}}) {
    const DType dt = arg.tensor.dtype;
    const bool ok =
        dt == DType::F32 || dt == DType::BF16 || (dt == DType::F64 && device == Device::CPU);
    PENTAD_CHECK(ok, "{}: '{}' is {}, want f32, bf16{}", op, arg.name, dtype_name(dt),
                 device == Device::CPU ? " or f64" : " (on CUDA)");
  }
  check_numel(op, {"out", out}, inp.numel());
  // The CPU converter switches on both element types itself, so the call's dtype is moot.
  run(
      Call{device, DType::F32, op}, [&] { cuda::convert(out, inp, inp.numel()); },
      [&](auto) { cpu::convert(out.data, out.dtype, inp.data, inp.dtype, inp.numel()); });
}

void refresh_weights(ParamStore& params) {
  const Tensor copy = params.compute_copy();
  if (present(copy)) convert(copy, params.all_params());
}

}  // namespace pentad::kernels
