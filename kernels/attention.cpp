// The doors of causal grouped-query attention (kernels/ops.h), forward and backward.
#include "kernels/cpu/attention.h"

#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

struct AttentionDims {
  int64_t B, T, Hq, Hkv, D;
};

// The sizes of q (b, t, hq, d) and k, v (b, t, hkv, d), checked against each other and,
// on CUDA, against the largest head_dim its kernels take.
AttentionDims attention_dims(const char* op, const Call& call, const Tensor& q, const Tensor& k,
                             const Tensor& v) {
  PENTAD_CHECK(q.shape.ndim == 4, "{}: q has shape {}, want (b, t, hq, d)", op, q.shape.str());
  PENTAD_CHECK(k.shape.ndim == 4, "{}: k has shape {}, want (b, t, hkv, d)", op, k.shape.str());
  const AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  check_shape(op, {"k", k}, {d.B, d.T, d.Hkv, d.D});
  check_shape(op, {"v", v}, k.shape);
  PENTAD_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
               "{}: {} query heads are not a multiple of {} kv heads", op, d.Hq, d.Hkv);
  if (call.cuda() && (d.D < 1 || d.D > cuda::kMaxHeadDim))
    fail("{}: head_dim {} is outside [1, {}], what the CUDA attention kernels take", op, d.D,
         cuda::kMaxHeadDim);
  return d;
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* op = "attention_forward";
  const Call call =
      check_args(op, {{"out", out}, {"q", q}, {"k", k}, {"v", v}}, {f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v);
  check_shape(op, {"out", out}, q.shape);
  check_shape(op, {"lse", lse}, {d.B, d.Hq, d.T});
  run(
      call, [&] { cuda::attention_forward(out, lse, q, k, v, d.B, d.T, d.Hq, d.Hkv, d.D); },
      [&]<typename T>(T) {
        cpu::attention_forward<T>(ptr<T>(out), ptr<T>(lse), ptr<T>(q), ptr<T>(k), ptr<T>(v), d.B,
                                  d.T, d.Hq, d.Hkv, d.D);
      });
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_backward";
  const Call call = check_args(op, {{"dq", dq},
                                    {"dk", dk},
                                    {"dv", dv},
                                    {"dout", dout},
                                    {"q", q},
                                    {"k", k},
                                    {"v", v},
                                    {"out", out},
                                    f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v);
  check_shape(op, {"dq", dq}, q.shape);
  check_shape(op, {"dk", dk}, k.shape);
  check_shape(op, {"dv", dv}, k.shape);
  check_shape(op, {"dout", dout}, q.shape);
  check_shape(op, {"out", out}, q.shape);
  check_shape(op, {"lse", lse}, {d.B, d.Hq, d.T});
  run(
      call,
      [&] {
        cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d.B, d.T, d.Hq, d.Hkv, d.D);
      },
      [&]<typename T>(T) {
        cpu::attention_backward<T>(ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<T>(dout), ptr<T>(q),
                                   ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<T>(lse), d.B, d.T, d.Hq,
                                   d.Hkv, d.D);
      });
}

}  // namespace pentad::kernels
