// The doors of the token (+ learned position) embedding (kernels/ops.h), whole or
// vocabulary-parallel, forward and backward.
#include "kernels/cpu/embedding.h"

#include <algorithm>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

// A position table (wpe or dwpe), when present, is (P, C) with a row for each position:
// P >= t without positions; with them (CPU), each position below P.
void check_table(const char* op, const Call& call, const Arg& wpe, const Tensor& positions,
                 int64_t T_, int64_t C) {
  const Tensor& t = wpe.tensor;
  if (!present(t)) return;
  const int64_t rows_needed = present(positions) ? 1 : T_;
  PENTAD_CHECK(t.shape.ndim == 2 && t.dim(1) == C && t.dim(0) >= rows_needed,
               "{}: {} has shape {}, want (>= {}, {})", op, wpe.name, t.shape.str(), rows_needed,
               C);
  if (present(positions) && !call.cuda()) check_indices(op, positions, t.dim(0), "position");
}

// Token ids come as (b, t).
void check_tokens(const char* op, const Tensor& tokens) {
  PENTAD_CHECK(tokens.shape.ndim == 2, "{}: tokens has shape {}, want (b, t)", op,
               tokens.shape.str());
}

}  // namespace

void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t vocab_start, const Tensor& positions) {
  const char* op = "embedding_forward";
  const Call call =
      check_args(op, {{"out", out}, {"wte", wte}}, {{"wpe", wpe}}, {{"tokens", tokens}});
  check_tokens(op, tokens);
  PENTAD_CHECK(wte.shape.ndim == 2, "{}: wte has shape {}, want (V, C)", op, wte.shape.str());
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), V = wte.dim(0), C = wte.dim(1);
  check_shape(op, {"out", out}, {B, T_, C});
  check_positions(op, call, {"positions", positions}, T_);
  check_table(op, call, {"wpe", wpe}, positions, T_, C);
  run(
      call,
      [&] { cuda::embedding_forward(out, tokens, wte, wpe, positions, B, T_, C, V, vocab_start); },
      [&]<typename T>(T) {
        if (vocab_start < 0) check_indices(op, tokens, V, "token");
        cpu::embedding_forward<T>(ptr<T>(out), ptr<int32_t>(tokens), ptr<T>(wte), ptr<T>(wpe),
                                  ptr<int32_t>(positions), B, T_, C,
                                  std::max<int64_t>(vocab_start, 0), V);
      });
}

void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t vocab_start, const Tensor& positions) {
  const char* op = "embedding_backward";
  const Call call =
      check_args(op, {{"dout", dout}}, {f32_on_cuda("dwte", dwte), f32_on_cuda("dwpe", dwpe)},
                 {{"tokens", tokens}});
  check_tokens(op, tokens);
  const int64_t B = tokens.dim(0), T_ = tokens.dim(1), C = cols(dout);
  check_shape(op, {"dout", dout}, {B, T_, C});
  if (present(dwte)) {
    PENTAD_CHECK(dwte.shape.ndim == 2 && dwte.dim(1) == C, "{}: dwte has shape {}, want (V, {})",
                 op, dwte.shape.str(), C);
    if (vocab_start < 0 && !call.cuda()) check_indices(op, tokens, dwte.dim(0), "token");
  }
  check_positions(op, call, {"positions", positions}, T_);
  check_table(op, call, {"dwpe", dwpe}, positions, T_, C);
  const int64_t V = present(dwte) ? dwte.dim(0) : 0;
  run(
      call,
      [&] {
        cuda::embedding_backward(dwte, dwpe, dout, tokens, positions, B, T_, C, V, vocab_start);
      },
      [&]<typename T>(T) {
        cpu::embedding_backward<T>(ptr<T>(dwte), ptr<T>(dwpe), ptr<T>(dout), ptr<int32_t>(tokens),
                                   ptr<int32_t>(positions), B, T_, C,
                                   std::max<int64_t>(vocab_start, 0), V);
      });
}

}  // namespace pentad::kernels
