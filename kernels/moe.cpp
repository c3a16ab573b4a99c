// The doors of the MoE token permutation (kernels/ops.h). The weights w and their gradient
// dw are per-pick statistics: F32 on CUDA whatever the data type, like a norm's rstd.
#include "kernels/cpu/moe.h"

#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

// pos (N, k) I32 and, when present, w (N, k): the picks of each token.
void check_picks(const char* op, const Tensor& pos, const Arg& w, int64_t N) {
  PENTAD_CHECK(pos.shape.ndim == 2 && pos.dim(0) == N, "{}: pos has shape {}, want ({}, k)", op,
               pos.shape.str(), N);
  check_shape(op, w, pos.shape);
}

}  // namespace

void moe_permute(Tensor out, const Tensor& inp, const Tensor& src) {
  const char* op = "moe_permute";
  const Call call = check_args(op, {{"out", out}, {"inp", inp}}, {}, {{"src", src}});
  const int64_t A = rows(out), C = cols(inp);
  check_matrix(op, {"out", out}, A, C);
  check_numel(op, {"src", src}, A);
  run(
      call, [&] { cuda::moe_permute(out, inp, src, A, C, rows(inp)); },
      [&]<typename T>(T) {
        check_indices(op, src, rows(inp), "row");
        cpu::moe_permute<T>(ptr<T>(out), ptr<T>(inp), ptr<int32_t>(src), A, C);
      });
}

void moe_unpermute(Tensor out, const Tensor& inp, const Tensor& pos, const Tensor& w,
                   bool accumulate) {
  const char* op = "moe_unpermute";
  const Call call =
      check_args(op, {{"out", out}, {"inp", inp}}, {f32_on_cuda("w", w)}, {{"pos", pos}});
  const int64_t N = rows(out), C = cols(out);
  check_matrix(op, {"inp", inp}, rows(inp), C);
  check_picks(op, pos, {"w", w}, N);
  run(
      call, [&] { cuda::moe_unpermute(out, inp, pos, w, N, pos.dim(1), C, rows(inp), accumulate); },
      [&]<typename T>(T) {
        cpu::moe_unpermute<T>(ptr<T>(out), ptr<T>(inp), ptr<int32_t>(pos),
                              present(w) ? ptr<T>(w) : nullptr, N, pos.dim(1), C, accumulate);
      });
}

void moe_unpermute_backward(Tensor dinp, Tensor dw, const Tensor& dout, const Tensor& inp,
                            const Tensor& pos, const Tensor& w) {
  const char* op = "moe_unpermute_backward";
  const Call call = check_args(
      op,
      {{"dinp", dinp}, f32_on_cuda("dw", dw), {"dout", dout}, {"inp", inp}, f32_on_cuda("w", w)},
      {}, {{"pos", pos}});
  const int64_t N = rows(dout), C = cols(dout);
  check_matrix(op, {"inp", inp}, rows(inp), C);
  check_matrix(op, {"dinp", dinp}, rows(inp), C);
  check_picks(op, pos, {"w", w}, N);
  check_shape(op, {"dw", dw}, pos.shape);
  run(
      call,
      [&] {
        cuda::moe_unpermute_backward(dinp, dw, dout, inp, pos, w, N, pos.dim(1), C, rows(inp));
      },
      [&]<typename T>(T) {
        cpu::moe_unpermute_backward<T>(ptr<T>(dinp), ptr<T>(dw), ptr<T>(dout), ptr<T>(inp),
                                       ptr<int32_t>(pos), ptr<T>(w), N, pos.dim(1), C);
      });
}

}  // namespace pentad::kernels
