// The doors of the elementwise activations (kernels/ops.h): GELU and SwiGLU, forward and
// backward.
#include "kernels/cpu/activations.h"

#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

void gelu_forward(Tensor out, const Tensor& inp) {
  const char* op = "gelu_forward";
  const Call call = check_args(op, {{"out", out}, {"inp", inp}});
  const int64_t n = inp.numel();
  check_numel(op, {"out", out}, n);
  run(
      call, [&] { cuda::gelu_forward(out, inp, n); },
      [&]<typename T>(T) { cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(inp), n); });
}

void gelu_backward(Tensor dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "gelu_backward";
  const Call call = check_args(op, {{"dinp", dinp}, {"dout", dout}, {"inp", inp}});
  const int64_t n = inp.numel();
  check_numel(op, {{"dinp", dinp}, {"dout", dout}}, n);
  run(
      call, [&] { cuda::gelu_backward(dinp, dout, inp, n); },
      [&]<typename T>(T) { cpu::gelu_backward<T>(ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), n); });
}

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  const Call call = check_args(op, {{"out", out}, {"gate", gate}, {"up", up}});
  const int64_t n = gate.numel();
  check_numel(op, {{"out", out}, {"up", up}}, n);
  run(
      call, [&] { cuda::swiglu_forward(out, gate, up, n); },
      [&]<typename T>(T) { cpu::swiglu_forward<T>(ptr<T>(out), ptr<T>(gate), ptr<T>(up), n); });
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  const Call call = check_args(op, {{"dout", dout}, {"gate", gate}, {"up", up}},
                               {{"dgate", dgate}, {"dup", dup}});
  const int64_t n = gate.numel();
  check_numel(op, {{"dout", dout}, {"up", up}, {"dgate", dgate}, {"dup", dup}}, n);
  run(
      call, [&] { cuda::swiglu_backward(dgate, dup, dout, gate, up, n); },
      [&]<typename T>(T) {
        cpu::swiglu_backward<T>(ptr<T>(dgate), ptr<T>(dup), ptr<T>(dout), ptr<T>(gate), ptr<T>(up),
                                n);
      });
}

}  // namespace pentad::kernels
