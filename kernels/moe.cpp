// The doors of the MoE token permutation (kernels/ops.h). CPU only for now: MoE on CUDA
// is refused at the recipe (src/train/recipe.cpp), and these say so if reached anyway.
#include "kernels/cpu/moe.h"

#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

[[noreturn]] void no_cuda(const char* op) {
  PENTAD_CHECK(false, "{}: the MoE kernels are not built for CUDA yet", op);
  throw;  // unreachable: PENTAD_CHECK(false) throws
}

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
  check_indices(op, src, rows(inp), "row");
  run(
      call, [&] { no_cuda(op); },
      [&]<typename T>(T) {
        cpu::moe_permute<T>(ptr<T>(out), ptr<T>(inp), ptr<int32_t>(src), A, C);
      });
}

void moe_unpermute(Tensor out, const Tensor& inp, const Tensor& pos, const Tensor& w,
                   bool accumulate) {
  const char* op = "moe_unpermute";
  const Call call = check_args(op, {{"out", out}, {"inp", inp}}, {{"w", w}}, {{"pos", pos}});
  const int64_t N = rows(out), C = cols(out);
  check_matrix(op, {"inp", inp}, rows(inp), C);
  check_picks(op, pos, {"w", w}, N);
  run(
      call, [&] { no_cuda(op); },
      [&]<typename T>(T) {
        cpu::moe_unpermute<T>(ptr<T>(out), ptr<T>(inp), ptr<int32_t>(pos),
                              present(w) ? ptr<T>(w) : nullptr, N, pos.dim(1), C, accumulate);
      });
}

void moe_unpermute_backward(Tensor dinp, Tensor dw, const Tensor& dout, const Tensor& inp,
                            const Tensor& pos, const Tensor& w) {
  const char* op = "moe_unpermute_backward";
  const Call call = check_args(
      op, {{"dinp", dinp}, {"dw", dw}, {"dout", dout}, {"inp", inp}, {"w", w}}, {}, {{"pos", pos}});
  const int64_t N = rows(dout), C = cols(dout);
  check_matrix(op, {"inp", inp}, rows(inp), C);
  check_matrix(op, {"dinp", dinp}, rows(inp), C);
  check_picks(op, pos, {"w", w}, N);
  check_shape(op, {"dw", dw}, pos.shape);
  run(
      call, [&] { no_cuda(op); },
      [&]<typename T>(T) {
        cpu::moe_unpermute_backward<T>(ptr<T>(dinp), ptr<T>(dw), ptr<T>(dout), ptr<T>(inp),
                                       ptr<int32_t>(pos), ptr<T>(w), N, pos.dim(1), C);
      });
}

}  // namespace pentad::kernels
