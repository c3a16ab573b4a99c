// Rotary embedding in place, "rotate half" pairing (i, i + D/2) as Hugging Face LLaMA.
// One thread per pair. Angles are computed in double and rounded once, as the CPU kernel
// does: positions reach the thousands, where a float angle would lose three digits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// x (B, T, H, D); token t has position positions[t], or pos_offset + t without positions.
// Forward: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin; the inverse uses -sin.
template <typename T>
__global__ void rope_kernel(T* x, const int32_t* positions, int64_t BT, int64_t T_, int64_t H,
                            int64_t D, int64_t pos_offset, double theta, float sign) {
  const int64_t half = D / 2, pairs = BT * H * half;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, bth = p / half;  // bth = bt * H + h
    const int64_t t = bth / H % T_;
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const int64_t pos = positions ? static_cast<int64_t>(positions[t]) : pos_offset + t;
    const double angle = static_cast<double>(pos) * inv_freq;
    const float c = static_cast<float>(cos(angle));
    const float s = sign * static_cast<float>(sin(angle));
    T* x1 = x + bth * D + i;
    T* x2 = x1 + half;
    const float a = to_f32(*x1), b = to_f32(*x2);
    *x1 = from_f32<T>(a * c - b * s);
    *x2 = from_f32<T>(b * c + a * s);
  }
}

}  // namespace

void rope_apply(const Tensor& x, const Tensor& positions, int64_t B, int64_t T, int64_t H,
                int64_t D, int64_t pos_offset, float theta, bool inverse) {
  const int64_t pairs = B * T * H * (D / 2);
  if (pairs == 0) return;
  by_dtype(x.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    rope_kernel<E><<<grid_for(pairs, kThreads), kThreads, 0, stream()>>>(
        ptr<E>(x), ptr<int32_t>(positions), B * T, T, H, D, pos_offset, static_cast<double>(theta),
        inverse ? -1.0f : 1.0f);
  });
  check_launch(inverse ? "rope_backward" : "rope_forward");
}

}  // namespace pentad::kernels::cuda
