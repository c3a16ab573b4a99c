// The doors of the MoE token permutation and of the experts' grouped linear layers
// (kernels/ops.h). The weights w and their gradient dw are per-pick statistics: F32 on CUDA
// whatever the data type, like a norm's rstd.
#include "kernels/cpu/moe.h"

#include <numeric>
#include <vector>

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

// The groups of a grouped linear: group_rows[g] >= 0 summing to R, one (OC, C) weight each
// and, when given, one dweight and one bias per group (each may be absent; `grads`: the
// biases are dbias, F32 on CUDA like dweight).
// Every present tensor must be on the call's device with its dtype.
void check_groups(const char* op, const Call& call, std::span<const int64_t> group_rows, int64_t R,
                  std::span<const Tensor> weight, std::span<const Tensor> dweight,
                  std::span<const Tensor> bias, bool grads, int64_t OC, int64_t C) {
  PENTAD_CHECK(weight.size() == group_rows.size(), "{}: {} weights for {} groups", op,
               weight.size(), group_rows.size());
  PENTAD_CHECK(dweight.empty() || dweight.size() == group_rows.size(),
               "{}: {} dweights for {} groups", op, dweight.size(), group_rows.size());
  PENTAD_CHECK(bias.empty() || bias.size() == group_rows.size(), "{}: {} biases for {} groups", op,
               bias.size(), group_rows.size());
  int64_t total = 0;
  for (size_t g = 0; g < group_rows.size(); ++g) {
    PENTAD_CHECK(group_rows[g] >= 0, "{}: group {} has {} rows", op, g, group_rows[g]);
    total += group_rows[g];
    const Tensor none;
    const Tensor& dw = dweight.empty() ? none : dweight[g];
    const Tensor& b = bias.empty() ? none : bias[g];
    const Call c =
        check_args(op, {{"weight", weight[g]}}, {f32_on_cuda("dweight", dw), {"bias", b, grads}});
    PENTAD_CHECK(c.device == call.device && c.dtype == call.dtype,
                 "{}: group {}'s tensors are not on the call's device or of its type", op, g);
    PENTAD_CHECK(weight[g].shape == (Shape{OC, C}), "{}: group {}'s weight has shape {}, want {}",
                 op, g, weight[g].shape.str(), Shape{OC, C}.str());
    check_shape(op, {"dweight", dw}, Shape{OC, C});
    check_shape(op, {"bias", b}, Shape{OC});
  }
  PENTAD_CHECK(total == R, "{}: the groups' rows sum to {}, but the input has {} rows", op, total,
               R);
}

template <typename T>
std::vector<T*> pointers(std::span<const Tensor> list, size_t groups) {
  std::vector<T*> out(groups, nullptr);
  for (size_t g = 0; g < list.size(); ++g) out[g] = present(list[g]) ? ptr<T>(list[g]) : nullptr;
  return out;
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

void grouped_linear_forward(Tensor out, const Tensor& inp, std::span<const int64_t> group_rows,
                            std::span<const Tensor> weight, std::span<const Tensor> bias) {
  const char* op = "grouped_linear_forward";
  Call call = check_args(op, {{"out", out}, {"inp", inp}});
  PENTAD_CHECK(!weight.empty(), "{}: no groups", op);
  const int64_t R = rows(inp), C = cols(inp), OC = weight[0].shape.ndim == 2 ? weight[0].dim(0) : 0;
  check_matrix(op, {"out", out}, R, OC);
  check_groups(op, call, group_rows, R, weight, {}, bias, false, OC, C);
  call.flops = gemm_flops(std::accumulate(group_rows.begin(), group_rows.end(), int64_t{0}), C, OC);
  run(
      call,
      [&] {  // one cuBLAS GEMM per group and layer, on the stream in order
        int64_t start = 0;
        for (size_t g = 0; g < group_rows.size(); start += group_rows[g], ++g)
          if (group_rows[g] > 0)
            cuda::linear_forward(out.rows(start, group_rows[g]), inp.rows(start, group_rows[g]),
                                 weight[g], bias.empty() ? Tensor{} : bias[g], group_rows[g], C,
                                 OC);
      },
      [&]<typename T>(T) {
        const size_t G = group_rows.size();
        const std::vector<T*> w = pointers<T>(weight, G), b = pointers<T>(bias, G);
        cpu::grouped_linear_forward<T>(ptr<T>(out), ptr<T>(inp), group_rows.data(), w.data(),
                                       bias.empty() ? nullptr : b.data(), int64_t(G), C, OC);
      });
}

void grouped_linear_backward(Tensor dinp, std::span<const Tensor> dweight,
                             std::span<const Tensor> dbias, const Tensor& dout, const Tensor& inp,
                             std::span<const int64_t> group_rows, std::span<const Tensor> weight,
                             bool accumulate_dinp) {
  const char* op = "grouped_linear_backward";
  Call call = check_args(op, {{"dout", dout}}, {{"dinp", dinp}, {"inp", inp}});
  PENTAD_CHECK(!weight.empty(), "{}: no groups", op);
  const int64_t R = rows(dout), OC = cols(dout),
                C = weight[0].shape.ndim == 2 ? weight[0].dim(1) : 0;
  check_matrix(op, {"dinp", dinp}, R, C);
  check_matrix(op, {"inp", inp}, R, C);
  PENTAD_CHECK(dweight.empty() || present(inp), "{}: 'inp' is required to compute dweight", op);
  check_groups(op, call, group_rows, R, weight, dweight, dbias, true, OC, C);
  call.flops =
      gemm_flops(std::accumulate(group_rows.begin(), group_rows.end(), int64_t{0}), C, OC) *
      (int(present(dinp)) + int(!dweight.empty()));
  run(
      call,
      [&] {
        int64_t start = 0;
        for (size_t g = 0; g < group_rows.size(); start += group_rows[g], ++g) {
          const int64_t n = group_rows[g];
          if (n == 0) continue;
          cuda::linear_backward(present(dinp) ? dinp.rows(start, n) : Tensor{},
                                dweight.empty() ? Tensor{} : dweight[g],
                                dbias.empty() ? Tensor{} : dbias[g], dout.rows(start, n),
                                present(inp) ? inp.rows(start, n) : Tensor{}, weight[g], n, C, OC,
                                accumulate_dinp);
        }
      },
      [&]<typename T>(T) {
        const size_t G = group_rows.size();
        const std::vector<T*> w = pointers<T>(weight, G), dw = pointers<T>(dweight, G),
                              db = pointers<T>(dbias, G);
        cpu::grouped_linear_backward<T>(
            present(dinp) ? ptr<T>(dinp) : nullptr, dweight.empty() ? nullptr : dw.data(),
            dbias.empty() ? nullptr : db.data(), ptr<T>(dout), present(inp) ? ptr<T>(inp) : nullptr,
            group_rows.data(), w.data(), int64_t(G), C, OC, accumulate_dinp);
      });
}

}  // namespace pentad::kernels
