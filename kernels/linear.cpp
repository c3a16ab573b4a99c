// The doors of the linear layers (kernels/ops.h): plain, with the GELU forward epilogue,
// and their backward passes.
#include "kernels/cpu/linear.h"

#include "kernels/cpu/activations.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

// A linear weight is (OC, C), as in PyTorch.
void check_weight(const char* op, const Tensor& weight) {
  PENTAD_CHECK(weight.shape.ndim == 2, "{}: weight has shape {}, want (OC, C)", op,
               weight.shape.str());
}

}  // namespace

void linear_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const char* op = "linear_forward";
  Call call = check_args(op, {{"out", out}, {"inp", inp}, {"weight", weight}}, {{"bias", bias}});
  check_weight(op, weight);
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(inp);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"out", out}, N, OC);
  check_shape(op, {"bias", bias}, {OC});
  call.flops = gemm_flops(N, C, OC);
  run(
      call, [&] { cuda::linear_forward(out, inp, weight, bias, N, C, OC); },
      [&]<typename T>(T) {
        cpu::linear_forward<T>(ptr<T>(out), ptr<T>(inp), ptr<T>(weight), ptr<T>(bias), N, C, OC);
      });
}

void linear_gelu_forward(Tensor out, Tensor pre_gelu, const Tensor& inp, const Tensor& weight,
                         const Tensor& bias) {
  const char* op = "linear_gelu_forward";
  Call call =
      check_args(op, {{"out", out}, {"pre_gelu", pre_gelu}, {"inp", inp}, {"weight", weight}},
                 {{"bias", bias}});
  check_weight(op, weight);
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(inp);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"out", out}, N, OC);
  check_matrix(op, {"pre_gelu", pre_gelu}, N, OC);
  check_shape(op, {"bias", bias}, {OC});
  call.flops = gemm_flops(N, C, OC);
  run(
      call, [&] { cuda::linear_gelu_forward(out, pre_gelu, inp, weight, bias, N, C, OC); },
      [&]<typename T>(T) {
        cpu::linear_forward<T>(ptr<T>(pre_gelu), ptr<T>(inp), ptr<T>(weight), ptr<T>(bias), N, C,
                               OC);
        cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(pre_gelu), N * OC);
      });
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, bool accumulate_dinp) {
  const char* op = "linear_backward";
  Call call = check_args(
      op, {{"dout", dout}, {"weight", weight}},
      {{"dinp", dinp}, f32_on_cuda("dweight", dweight), f32_on_cuda("dbias", dbias), {"inp", inp}});
  check_weight(op, weight);
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(dout);
  check_matrix(op, {"dout", dout}, N, OC);
  check_matrix(op, {"dinp", dinp}, N, C);
  PENTAD_CHECK(!present(dweight) || present(inp), "{}: 'inp' is required to compute dweight", op);
  check_shape(op, {"dweight", dweight}, weight.shape);
  check_matrix(op, {"inp", inp}, N, C);
  check_shape(op, {"dbias", dbias}, {OC});
  call.flops = gemm_flops(N, C, OC) * (int(present(dinp)) + int(present(dweight)));
  run(
      call,
      [&] {
        cuda::linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, accumulate_dinp);
      },
      [&]<typename T>(T) {
        cpu::linear_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                                ptr<T>(inp), ptr<T>(weight), N, C, OC, accumulate_dinp);
      });
}

void linear_backward_gelu(Tensor dpre_gelu, Tensor dweight, Tensor dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& pre_gelu) {
  const char* op = "linear_backward_gelu";
  Call call = check_args(op,
                         {{"dpre_gelu", dpre_gelu},
                          {"dout", dout},
                          {"inp", inp},
                          {"weight", weight},
                          {"pre_gelu", pre_gelu}},
                         {f32_on_cuda("dweight", dweight), f32_on_cuda("dbias", dbias)});
  check_weight(op, weight);
  const int64_t OC = weight.dim(0), C = weight.dim(1), N = rows(dout);
  check_matrix(op, {"dout", dout}, N, OC);
  check_matrix(op, {"dpre_gelu", dpre_gelu}, N, C);
  check_matrix(op, {"inp", inp}, N, C);
  check_matrix(op, {"pre_gelu", pre_gelu}, N, C);
  check_shape(op, {"dweight", dweight}, weight.shape);
  check_shape(op, {"dbias", dbias}, {OC});
  call.flops = gemm_flops(N, C, OC) * (1 + int(present(dweight)));
  run(
      call,
      [&] {
        cuda::linear_backward_gelu(dpre_gelu, dweight, dbias, dout, inp, weight, pre_gelu, N, C,
                                   OC);
      },
      [&]<typename T>(T) {
        cpu::linear_backward<T>(ptr<T>(dpre_gelu), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                                ptr<T>(inp), ptr<T>(weight), N, C, OC, false);
        cpu::gelu_backward<T>(ptr<T>(dpre_gelu), ptr<T>(dpre_gelu), ptr<T>(pre_gelu), N * C);
      });
}

}  // namespace pentad::kernels
