// The doors of LayerNorm and RMSNorm (kernels/ops.h), each with its residual add fused in
// front, and their backward passes.
#include "kernels/cpu/norms.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

// The outputs and parameters of a norm over N rows of C; mean, bias may be absent (RMSNorm).
void check_norm(const char* op, const Tensor& out, const Tensor& weight, const Tensor& bias,
                const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C) {
  check_matrix(op, {"out", out}, N, C);
  check_shape(op, {"weight", weight}, {C});
  check_shape(op, {"bias", bias}, {C});
  check_numel(op, {{"mean", mean}, {"rstd", rstd}}, N);
}

}  // namespace

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "layernorm_forward";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}},
                 {f32_on_cuda("mean", mean), f32_on_cuda("rstd", rstd), {"bias", bias}});
  const int64_t C = cols(inp), N = rows(inp);
  check_norm(op, out, weight, bias, mean, rstd, N, C);
  run(
      call, [&] { cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps); },
      [&]<typename T>(T) {
        cpu::layernorm_forward<T>(ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), ptr<T>(inp),
                                  ptr<T>(weight), ptr<T>(bias), N, C, static_cast<T>(eps));
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
  check_norm(op, out, weight, bias, mean, rstd, N, C);
  run(
      call,
      [&] {
        cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, N, C, eps);
      },
      [&]<typename T>(T) {
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
  check_matrix(op, {"dinp", dinp}, N, C);
  check_shape(op, {"weight", weight}, {C});
  check_shape(op, {"dweight", dweight}, {C});
  check_shape(op, {"dbias", dbias}, {C});
  check_numel(op, {{"mean", mean}, {"rstd", rstd}}, N);
  run(
      call,
      [&] { cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); },
      [&]<typename T>(T) {
        cpu::layernorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                                   ptr<T>(inp), ptr<T>(weight), ptr<T>(mean), ptr<T>(rstd), N, C);
      });
}

void rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& inp, const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}}, {f32_on_cuda("rstd", rstd)});
  const int64_t C = cols(inp), N = rows(inp);
  check_norm(op, out, weight, Tensor{}, Tensor{}, rstd, N, C);
  run(
      call, [&] { cuda::rmsnorm_forward(out, rstd, inp, weight, N, C, eps); },
      [&]<typename T>(T) {
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
  check_norm(op, out, weight, Tensor{}, Tensor{}, rstd, N, C);
  run(
      call, [&] { cuda::residual_rmsnorm_forward(residual, out, rstd, a, b, weight, N, C, eps); },
      [&]<typename T>(T) {
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
  check_matrix(op, {"dinp", dinp}, N, C);
  check_shape(op, {"weight", weight}, {C});
  check_shape(op, {"dweight", dweight}, {C});
  check_numel(op, {"rstd", rstd}, N);
  run(
      call, [&] { cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); },
      [&]<typename T>(T) {
        cpu::rmsnorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dout), ptr<T>(inp),
                                 ptr<T>(weight), ptr<T>(rstd), N, C);
      });
}

}  // namespace pentad::kernels
