// The door of the fused optimizer step (kernels/ops.h): AdamW over one flat region.
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

void adamw_update(const AdamWState& from, const AdamWState& to, const Tensor& grads, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const char* op = "adamw_update";
  const Call call = check_args(
      op, {f32_on_cuda("params", from.params), f32_on_cuda("m", from.m), f32_on_cuda("v", from.v),
           f32_on_cuda("params_out", to.params), f32_on_cuda("m_out", to.m),
           f32_on_cuda("v_out", to.v), f32_on_cuda("grads", grads)});
  const int64_t n = from.params.numel();
  check_numel(op,
              {{"m", from.m},
               {"v", from.v},
               {"params_out", to.params},
               {"m_out", to.m},
               {"v_out", to.v},
               {"grads", grads}},
              n);
  PENTAD_CHECK(step >= 1, "{}: step counts from 1, got {}", op, step);
  run(
      call,
      [&] {
        cuda::adamw_update(from.params, from.m, from.v, to.params, to.m, to.v, grads, n, lr, beta1,
                           beta2, eps, weight_decay, step);
      },
      [&]<typename T>(T) {
        cpu::adamw_update<T>(ptr<T>(from.params), ptr<T>(from.m), ptr<T>(from.v), ptr<T>(to.params),
                             ptr<T>(to.m), ptr<T>(to.v), ptr<T>(grads), n, lr, beta1, beta2, eps,
                             weight_decay, step);
      });
}

void adamw_update(Tensor params, Tensor m, Tensor v, const Tensor& grads, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step) {
  const AdamWState state{params, m, v};
  adamw_update(state, state, grads, lr, beta1, beta2, eps, weight_decay, step);
}

}  // namespace pentad::kernels
