// Times every CUDA kernel at GPT-2 124M shapes (B 8, T 1024, C 768, 12 heads, vocabulary
// 50304, bf16 activations, F32 parameter gradients and AdamW), with CUDA events: median of
// 20 runs after 3 warm-ups, on random inputs. Prints each kernel's time, its FLOP/s (GEMMs,
// attention; cuDNN's attention beside pentad's) and its bandwidth against the bytes it must move at
// least (everything else), and, for layernorm_backward and cross-entropy, the same at micro-batch
// 4 and 8 beside a device-to-device copy. Never run as a test; see ../shared/MEASURE.md.
//   build/pentad_gpu_kernels_bench [B] [T]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace k = pentad::kernels;
using pentad::Arena;
using pentad::Device;
using pentad::DType;
using pentad::Shape;
using pentad::Tensor;

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

// Device tensors filled with normal values (F32 generated on the host, converted on the GPU).
class Tensors {
 public:
  Tensor make(Shape shape, DType dtype, float stddev = 1.0f) {
    Tensor t = alloc(shape, dtype);
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> host(static_cast<size_t>(shape.numel()));
    for (float& x : host) x = normal(rng_);
    Tensor staging = dtype == DType::F32 ? t : alloc(shape, DType::F32);
    pentad::copy_bytes(staging.data, Device::CUDA, host.data(), Device::CPU, staging.bytes());
    if (dtype != DType::F32) k::convert(t, staging);
    return t;
  }
  Tensor ids(Shape shape, int64_t limit) {
    Tensor t = alloc(shape, DType::I32);
    std::vector<int32_t> host(static_cast<size_t>(shape.numel()));
    for (int32_t& x : host) x = static_cast<int32_t>(rng_() % static_cast<uint64_t>(limit));
    pentad::copy_bytes(t.data, Device::CUDA, host.data(), Device::CPU, t.bytes());
    return t;
  }

 private:
  Tensor alloc(Shape shape, DType dtype) {
    arenas_.emplace_back("bench", static_cast<size_t>(shape.numel()) * pentad::dtype_bytes(dtype),
                         Device::CUDA);
    return arenas_.back().alloc(shape, dtype);
  }
  std::deque<Arena> arenas_;
  std::mt19937_64 rng_{1234};
};

// Median milliseconds of f over 20 timed runs after 3 warm-ups.
double median_ms(const std::function<void()>& f) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void report(const std::string& name, double ms, double flops, double bytes) {
  std::printf("%-40s %9.3f ms", name.c_str(), ms);
  if (flops > 0) std::printf("  %8.1f TFLOP/s", flops / ms * 1e-9);
  if (bytes > 0) std::printf("  %8.1f GB/s", bytes / ms * 1e-6);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (pentad::cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const int64_t B = argc > 1 ? std::atoll(argv[1]) : 8, T = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t C = 768, H = 12, D = 64, V = 50304, N = B * T, params = 124'000'000;
  const DType bf = DType::BF16, f32 = DType::F32;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s; B %lld, T %lld, C %lld, %lld heads, V %lld, bf16\n", prop.name,
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(C),
              static_cast<long long>(H), static_cast<long long>(V));
  Tensors make;
  const double e = 2.0;  // bytes per bf16 element

  {  // GEMMs: the qkv projection and the MLP's first layer with GELU.
    const Tensor x = make.make({N, C}, bf), w = make.make({3 * C, C}, bf, 0.02f);
    const Tensor b = make.make({3 * C}, bf), out = make.make({N, 3 * C}, bf);
    report("linear_forward (qkv)", median_ms([&] { k::linear_forward(out, x, w, b); }),
           2.0 * N * C * 3 * C, 0);
    const Tensor w4 = make.make({4 * C, C}, bf, 0.02f), b4 = make.make({4 * C}, bf);
    const Tensor h = make.make({N, 4 * C}, bf), pre = make.make({N, 4 * C}, bf);
    report("linear_gelu_forward (fc)",
           median_ms([&] { k::linear_gelu_forward(h, pre, x, w4, b4); }), 2.0 * N * C * 4 * C, 0);
    const Tensor dx = make.make({N, C}, bf), dw = make.make({4 * C, C}, f32);
    const Tensor db = make.make({4 * C}, f32);
    report("linear_backward (fc)",
           median_ms([&] { k::linear_backward(dx, dw, db, h, x, w4, false); }), 4.0 * N * C * 4 * C,
           0);
  }
  {  // Norms, residual, activations.
    const Tensor a = make.make({N, C}, bf), r = make.make({N, C}, bf), out = make.make({N, C}, bf);
    const Tensor w = make.make({C}, bf), b = make.make({C}, bf);
    const Tensor mean = make.make({N}, f32), rstd = make.make({N}, f32);
    report("layernorm_forward",
           median_ms([&] { k::layernorm_forward(out, mean, rstd, a, w, b, 1e-5f); }), 0,
           2.0 * N * C * e);
    report("residual_layernorm_forward",
           median_ms([&] { k::residual_layernorm_forward(r, out, mean, rstd, r, a, w, b, 1e-5f); }),
           0, 4.0 * N * C * e);
    const Tensor dw = make.make({C}, f32), db = make.make({C}, f32), dx = make.make({N, C}, bf);
    report("layernorm_backward",
           median_ms([&] { k::layernorm_backward(dx, dw, db, out, a, w, mean, rstd); }), 0,
           4.0 * N * C * e);
    const Tensor h = make.make({N, 4 * C}, bf), g = make.make({N, 4 * C}, bf);
    report("gelu_forward", median_ms([&] { k::gelu_forward(g, h); }), 0, 2.0 * N * 4 * C * e);
    report("gelu_backward", median_ms([&] { k::gelu_backward(g, g, h); }), 0, 3.0 * N * 4 * C * e);
  }
  // Attention: causal FLOPs, 4 B H T^2 D / 2 forward and 2.5 times that backward; pentad's
  // kernel and cuDNN's (train.attention), at GPT-2's heads, at two grouped-query shapes
  // (LLaMA-1B's 32:8 heads of 64, and 16:2 heads of 128) and at two wide ones (8 heads of 160,
  // as the 530B and 1T GPT configurations, and 4:1 heads of 256, pentad's kernel keeping its
  // output in shared memory). bench/attention_torch.py times PyTorch's SDPA on the same
  // shapes, named the same way.
  struct Heads {
    int64_t hq, hkv, d;
  };
  for (const Heads& a :
       {Heads{H, H, D}, Heads{32, 8, 64}, Heads{16, 2, 128}, Heads{8, 8, 160}, Heads{4, 1, 256}}) {
    const Shape sq{B, T, a.hq, a.d}, skv{B, T, a.hkv, a.d};
    const Tensor q = make.make(sq, bf), kk = make.make(skv, bf), v = make.make(skv, bf);
    const Tensor out = make.make(sq, bf), lse = make.make({B, a.hq, T}, f32);
    const Tensor dq = make.make(sq, bf), dk = make.make(skv, bf), dv = make.make(skv, bf);
    const double fwd = 2.0 * B * a.hq * static_cast<double>(T) * T * a.d;
    const std::string shape =
        " h" + std::to_string(a.hq) + ":" + std::to_string(a.hkv) + " d" + std::to_string(a.d);
    for (auto [impl, name] : {std::pair{k::AttentionImpl::Pentad, "pentad"},
                              std::pair{k::AttentionImpl::Cudnn, "cudnn"}}) {
      k::set_attention_impl(impl);
      report(std::string("attention_forward ") + name + shape,
             median_ms([&] { k::attention_forward(out, lse, q, kk, v); }), fwd, 0);
      report(std::string("attention_backward ") + name + shape,
             median_ms([&] { k::attention_backward(dq, dk, dv, out, q, kk, v, out, lse); }),
             2.5 * fwd, 0);
    }
    k::set_attention_impl(k::AttentionImpl::Auto);
  }
  {  // Classifier, embedding.
    const Tensor logits = make.make({N, V}, bf), losses = make.make({N}, f32);
    const Tensor targets = make.ids({N}, V);
    report("crossentropy_forward_backward", median_ms([&] {
             k::crossentropy_forward_backward(losses, logits, logits, targets, 1.0f / N);
           }),
           0, 2.0 * N * V * e);
    const Tensor tokens = make.ids({B, T}, V), wte = make.make({V, C}, bf);
    const Tensor wpe = make.make({T, C}, bf), out = make.make({B, T, C}, bf);
    report("embedding_forward", median_ms([&] { k::embedding_forward(out, tokens, wte, wpe); }), 0,
           2.0 * N * C * e);
    const Tensor dwte = make.make({V, C}, f32), dwpe = make.make({T, C}, f32);
    report("embedding_backward", median_ms([&] { k::embedding_backward(dwte, dwpe, out, tokens); }),
           0, N * C * e + 2.0 * N * C * 4);
  }
  {  // Issue 44's two memory-bound kernels at GPT-2 124M's shapes for micro-batches 4 and 8,
     // beside a device-to-device copy of 1 GiB (the card's ceiling: read + write). Bytes as
     // above: the least each must move (the norms' parameter-gradient partials left out).
    const int64_t copy_bytes = int64_t{1} << 30;
    const Tensor src = make.make({copy_bytes / 4}, f32, 0.0f),
                 dst = make.make({copy_bytes / 4}, f32, 0.0f);
    report("copy (cudaMemcpy device to device, 1 GiB)", median_ms([&] {
             check(
                 cudaMemcpyAsync(dst.data, src.data, copy_bytes, cudaMemcpyDeviceToDevice, nullptr),
                 "cudaMemcpyAsync");
           }),
           0, 2.0 * copy_bytes);
    for (const int64_t b : {int64_t{4}, int64_t{8}}) {
      const int64_t rows = b * T;
      const std::string at = " B" + std::to_string(b);
      const Tensor x = make.make({rows, C}, bf), dy = make.make({rows, C}, bf);
      const Tensor dx = make.make({rows, C}, bf), w = make.make({C}, bf);
      const Tensor mean = make.make({rows}, f32), rstd = make.make({rows}, f32, 0.0f);
      const Tensor dw = make.make({C}, f32), db = make.make({C}, f32);
      report("layernorm_backward" + at,
             median_ms([&] { k::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd); }), 0,
             4.0 * rows * C * e);
      report("rmsnorm_backward" + at,
             median_ms([&] { k::rmsnorm_backward(dx, dw, dy, x, w, rstd); }), 0,
             4.0 * rows * C * e);
      const Tensor logits = make.make({rows, V}, bf), losses = make.make({rows}, f32);
      const Tensor targets = make.ids({rows}, V);
      report("crossentropy_forward_backward in place" + at, median_ms([&] {
               k::crossentropy_forward_backward(losses, logits, logits, targets, 1.0f / rows);
             }),
             0, 2.0 * rows * V * e);
      report("crossentropy_forward (losses only)" + at, median_ms([&] {
               k::crossentropy_forward_backward(losses, Tensor{}, logits, targets, 1.0f / rows);
             }),
             0, 1.0 * rows * V * e);
    }
  }
  {  // Optimizer over every parameter: 4 F32 reads, 3 writes.
    const Tensor p = make.make({params}, f32), m = make.make({params}, f32, 0.01f);
    const Tensor v = make.make({params}, f32, 0.0f), g = make.make({params}, f32);
    report("adamw_update (124M)",
           median_ms([&] { k::adamw_update(p, m, v, g, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10); }), 0,
           28.0 * params);
    report("sum_squares (124M)", median_ms([&] { k::sum_squares(g); }), 0, 4.0 * params);
  }
  return 0;
}
