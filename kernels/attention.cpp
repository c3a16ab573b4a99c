// The doors of causal grouped-query attention (kernels/ops.h): forward, backward and the
// log-sum-exp merge of blocks (context parallelism).
#include "kernels/cpu/attention.h"

#include <atomic>
#include <string>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

struct AttentionDims {
  int64_t B, Tq, Tk, Hq, Hkv, D;
};

// The sizes of q (b, tq, hq, d) and k, v (b, tk, hkv, d), checked against each other and
// against the positions, and on CUDA against the largest head_dim its kernels take.
AttentionDims attention_dims(const char* op, const Call& call, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& q_pos, const Tensor& k_pos) {
  PENTAD_CHECK(q.shape.ndim == 4, "{}: q has shape {}, want (b, tq, hq, d)", op, q.shape.str());
  PENTAD_CHECK(k.shape.ndim == 4, "{}: k has shape {}, want (b, tk, hkv, d)", op, k.shape.str());
  const AttentionDims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  check_shape(op, {"k", k}, {d.B, d.Tk, d.Hkv, d.D});
  check_shape(op, {"v", v}, k.shape);
  PENTAD_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0,
               "{}: {} query heads are not a multiple of {} kv heads", op, d.Hq, d.Hkv);
  PENTAD_CHECK(present(q_pos) == present(k_pos),
               "{}: q_pos and k_pos must be given together (or neither, for 0..t-1)", op);
  if (!present(q_pos))
    PENTAD_CHECK(d.Tq == d.Tk, "{}: q has {} tokens but k has {}; without positions they match", op,
                 d.Tq, d.Tk);
  check_positions(op, call, {"q_pos", q_pos}, d.Tq);
  check_positions(op, call, {"k_pos", k_pos}, d.Tk);
  if (call.cuda() && (d.D < 1 || d.D > cuda::kMaxHeadDim))
    fail("{}: head_dim {} is outside [1, {}], what the CUDA attention kernels take", op, d.D,
         cuda::kMaxHeadDim);
  return d;
}

// The forward's FLOPs for the op profile, as pentad plan counts them: two products (q k^T,
// then p v) over the causal half. A block with positions (context parallelism) may be
// whole, half or empty under its mask: not counted.
double causal_flops(const AttentionDims& d, bool positions) {
  if (positions) return 0;
  return 2.0 * double(d.B) * double(d.Hq) * double(d.Tq) * double(d.Tk) * double(d.D);
}

std::atomic<AttentionImpl> impl{AttentionImpl::Auto};

// Whether a CUDA call goes to cuDNN (ops.h, AttentionImpl). Only called from run()'s CUDA
// branch. The first call of a shape builds cuDNN's graph for that direction.
bool cudnn_takes(const char* op, const Call& call, const AttentionDims& d, bool positions,
                 bool backward) {
  const AttentionImpl want = impl.load();
  if (!kCudaBuilt || want == AttentionImpl::Pentad || positions) return false;
  if (want == AttentionImpl::Auto && call.dtype != DType::BF16) return false;
  std::string why;
  if (cuda::cudnn_attention_supported(backward, d.B, d.Tq, d.Hq, d.Hkv, d.D, &why)) return true;
  if (want == AttentionImpl::Cudnn)
    fail(
        "{}: train.attention = \"cudnn\", but cuDNN refuses b {}, t {}, hq {}, hkv {}, d {}: {} "
        "(\"auto\" falls back to pentad's kernel)",
        op, d.B, d.Tq, d.Hq, d.Hkv, d.D, why);
  return false;
}

}  // namespace

void set_attention_impl(AttentionImpl value) {
  impl.store(value);
}

AttentionImpl attention_impl() {
  return impl.load();
}

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& q_pos, const Tensor& k_pos) {
  const char* op = "attention_forward";
  Call call =
      check_args(op, {{"out", out}, {"q", q}, {"k", k}, {"v", v}}, {f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v, q_pos, k_pos);
  check_shape(op, {"out", out}, q.shape);
  check_shape(op, {"lse", lse}, {d.B, d.Hq, d.Tq});
  call.flops = causal_flops(d, present(q_pos));
  run(
      call,
      [&] {
        if (cudnn_takes(op, call, d, present(q_pos), false))
          cuda::cudnn_attention_forward(out, lse, q, k, v, d.B, d.Tq, d.Hq, d.Hkv, d.D);
        else
          cuda::attention_forward(out, lse, q, k, v, q_pos, k_pos, d.B, d.Tq, d.Tk, d.Hq, d.Hkv,
                                  d.D);
      },
      [&]<typename T>(T) {
        cpu::attention_forward<T>(ptr<T>(out), ptr<T>(lse), ptr<T>(q), ptr<T>(k), ptr<T>(v),
                                  ptr<int32_t>(q_pos), ptr<int32_t>(k_pos), d.B, d.Tq, d.Tk, d.Hq,
                                  d.Hkv, d.D);
      });
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& q_pos, const Tensor& k_pos, bool accumulate) {
  const char* op = "attention_backward";
  Call call = check_args(op, {{"dq", dq},
                              {"dk", dk},
                              {"dv", dv},
                              {"dout", dout},
                              {"q", q},
                              {"k", k},
                              {"v", v},
                              {"out", out},
                              f32_on_cuda("lse", lse)});
  const AttentionDims d = attention_dims(op, call, q, k, v, q_pos, k_pos);
  check_shape(op, {"dq", dq}, q.shape);
  check_shape(op, {"dk", dk}, k.shape);
  check_shape(op, {"dv", dv}, k.shape);
  check_shape(op, {"dout", dout}, q.shape);
  check_shape(op, {"out", out}, q.shape);
  check_shape(op, {"lse", lse}, {d.B, d.Hq, d.Tq});
  call.flops = 2 * causal_flops(d, present(q_pos));  // two products for each of forward's
  run(
      call,
      [&] {
        if (cudnn_takes(op, call, d, present(q_pos), true))
          cuda::cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d.B, d.Tq, d.Hq,
                                         d.Hkv, d.D, accumulate);
        else
          cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, d.B, d.Tq,
                                   d.Tk, d.Hq, d.Hkv, d.D, accumulate);
      },
      [&]<typename T>(T) {
        cpu::attention_backward<T>(ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<T>(dout), ptr<T>(q),
                                   ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<T>(lse),
                                   ptr<int32_t>(q_pos), ptr<int32_t>(k_pos), d.B, d.Tq, d.Tk, d.Hq,
                                   d.Hkv, d.D, accumulate);
      });
}

void attention_merge(Tensor out, Tensor lse, const Tensor& block_out, const Tensor& block_lse) {
  const char* op = "attention_merge";
  const Call call = check_args(op, {{"out", out},
                                    f32_on_cuda("lse", lse),
                                    {"block_out", block_out},
                                    f32_on_cuda("block_lse", block_lse)});
  PENTAD_CHECK(out.shape.ndim == 4, "{}: out has shape {}, want (b, t, h, d)", op, out.shape.str());
  const int64_t B = out.dim(0), T_ = out.dim(1), H = out.dim(2), D = out.dim(3);
  check_shape(op, {"block_out", block_out}, out.shape);
  check_shape(op, {"lse", lse}, {B, H, T_});
  check_shape(op, {"block_lse", block_lse}, {B, H, T_});
  run(
      call, [&] { cuda::attention_merge(out, lse, block_out, block_lse, B, T_, H, D); },
      [&]<typename T>(T) {
        cpu::attention_merge<T>(ptr<T>(out), ptr<T>(lse), ptr<T>(block_out), ptr<T>(block_lse), B,
                                T_, H, D);
      });
}

}  // namespace pentad::kernels
