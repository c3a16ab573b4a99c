// The doors of the rotary embedding (kernels/ops.h): one rotation, applied forward or
// inverted for the backward pass, in place.
#include "kernels/cpu/rope.h"

#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

namespace {

void rope(const char* op, Tensor x, int64_t pos_offset, float theta, const Tensor& positions,
          bool inverse) {
  const Call call = check_args(op, {{"x", x}});
  PENTAD_CHECK(x.shape.ndim == 4, "{}: x has shape {}, want (b, t, heads, head_dim)", op,
               x.shape.str());
  PENTAD_CHECK(x.dim(3) % 2 == 0, "{}: head_dim {} must be even", op, x.dim(3));
  PENTAD_CHECK(theta > 0.0f && pos_offset >= 0, "{}: theta {} and pos_offset {} must be positive",
               op, theta, pos_offset);
  const int64_t B = x.dim(0), T_ = x.dim(1), H = x.dim(2), D = x.dim(3);
  check_positions(op, call, {"positions", positions}, T_);
  PENTAD_CHECK(!present(positions) || pos_offset == 0,
               "{}: pos_offset {} with positions given; the positions are already absolute", op,
               pos_offset);
  run(
      call, [&] { cuda::rope_apply(x, positions, B, T_, H, D, pos_offset, theta, inverse); },
      [&]<typename T>(T) {
        cpu::rope_apply<T>(ptr<T>(x), B, T_, H, D, pos_offset, ptr<int32_t>(positions), theta,
                           inverse);
      });
}

}  // namespace

void rope_forward(Tensor x, int64_t pos_offset, float theta, const Tensor& positions) {
  rope("rope_forward", x, pos_offset, theta, positions, false);
}

void rope_backward(Tensor dx, int64_t pos_offset, float theta, const Tensor& positions) {
  rope("rope_backward", dx, pos_offset, theta, positions, true);
}

}  // namespace pentad::kernels
