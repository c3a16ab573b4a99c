// The door of the fused optimizer step (kernels/ops.h): AdamW over one flat region.
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

void adamw_update(Tensor params, Tensor m, Tensor v, const Tensor& grads, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step) {
  const char* op = "adamw_update";
  const Call call = check_args(op, {f32_on_cuda("params", params), f32_on_cuda("m", m),
                                    f32_on_cuda("v", v), f32_on_cuda("grads", grads)});
  const int64_t n = params.numel();
  check_numel(op, {{"m", m}, {"v", v}, {"grads", grads}}, n);
  PENTAD_CHECK(step >= 1, "{}: step counts from 1, got {}", op, step);
  run(
      call,
      [&] {
        cuda::adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, step);
      },
      [&]<typename T>(T) {
        cpu::adamw_update<T>(ptr<T>(params), ptr<T>(m), ptr<T>(v), ptr<T>(grads), n, lr, beta1,
                             beta2, eps, weight_decay, step);
      });
}

}  // namespace pentad::kernels
