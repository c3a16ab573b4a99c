// cuda_kernels_test's own source (the program, its fixtures and bounds:
// cuda_kernels_test.h): the dtype instantiation, the element-wise ops (activations, add,
// scale, sums, conversion, AdamW), the door's refusals and the device arenas. The other op
// families: cuda_kernels_linear_test.cpp, _rows_ (norms, cross-entropy), _attention_ (rope,
// attention), _gather_ (embedding, MoE permutation), and cudnn_attention_test.cpp.
#include "tests/cuda/cuda_kernels_test.h"

#include <bit>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace pentad::cuda_kernels {
namespace {

const char* name_of(DType dtype) {
  return dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKernel, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(name_of(info.param));
                         });

// ---- activations ----

const int64_t kFlatSizes[] = {1, 7, 1000, 65537};

TEST_P(CudaKernel, Gelu) {
  for (int64_t n : kFlatSizes) {
    const auto x = rand(n, 2.0), dy = rand(n);
    std::vector<float> out(n), dx(n);
    k::gelu_forward(view(out, {n}), view(x, {n}));
    k::gelu_backward(view(dx, {n}), view(dy, {n}), view(x, {n}));
    const Tensor gx = gpu.upload(x, {n}, dt());
    const Tensor gout = gpu.poisoned({n}, dt()), gdx = gpu.poisoned({n}, dt());
    k::gelu_forward(gout, gx);
    k::gelu_backward(gdx, gpu.upload(dy, {n}, dt()), gx);
    // Against the inputs' scale (std 2): where 1 + tanh(u) cancels (x below about -2) both
    // sides keep float's absolute error, not a relative one, and with n = 1 the one output
    // can be that small (3.6e-5 relative to it on an H200, 2026-11-27).
    expect_close("gelu forward n " + std::to_string(n), gout, out, dt(), 1.0);
    expect_close("gelu backward n " + std::to_string(n), gdx, dx, dt(), 1.0);
  }
}

TEST_P(CudaKernel, SwiGlu) {
  for (int64_t n : kFlatSizes) {
    const auto g = rand(n, 2.0), u = rand(n), dy = rand(n);
    std::vector<float> out(n), dg(n), du(n);
    k::swiglu_forward(view(out, {n}), view(g, {n}), view(u, {n}));
    k::swiglu_backward(view(dg, {n}), view(du, {n}), view(dy, {n}), view(g, {n}), view(u, {n}));
    const Tensor gg = gpu.upload(g, {n}, dt()), gu = gpu.upload(u, {n}, dt());
    const Tensor gdy = gpu.upload(dy, {n}, dt());
    const Tensor gout = gpu.poisoned({n}, dt()), gdg = gpu.poisoned({n}, dt());
    const Tensor gdu = gpu.poisoned({n}, dt());
    k::swiglu_forward(gout, gg, gu);
    k::swiglu_backward(gdg, gdu, gdy, gg, gu);
    expect_close("swiglu forward", gout, out, dt());
    expect_close("swiglu dgate", gdg, dg, dt());
    expect_close("swiglu dup", gdu, du, dt());
    // Either gradient may be absent.
    const Tensor only_up = gpu.poisoned({n}, dt());
    k::swiglu_backward(Tensor{}, only_up, gdy, gg, gu);
    expect_close("swiglu dup alone", only_up, du, dt());
  }
}

// ---- elementwise ----

TEST_P(CudaKernel, AddScaleSumSquares) {
  for (int64_t n : kFlatSizes) {
    const auto a = rand(n), b = rand(n);
    std::vector<float> sum(n);
    k::add(view(sum, {n}), view(a, {n}), view(b, {n}));
    const Tensor ga = gpu.upload(a, {n}, dt()), gb = gpu.upload(b, {n}, dt());
    const Tensor gsum = gpu.poisoned({n}, dt());
    k::add(gsum, ga, gb);
    expect_close("add n " + std::to_string(n), gsum, sum, dt());
    k::add(ga, ga, gb);  // out aliasing a
    expect_close("add in place n " + std::to_string(n), ga, sum, dt());

    std::vector<float> scaled = b;
    k::scale(view(scaled, {n}), -0.37f);
    k::scale(gb, -0.37f);
    expect_close("scale n " + std::to_string(n), gb, scaled, dt());

    const double want = k::sum_squares(view(a, {n}));  // a holds values exact in dt
    const double got = k::sum_squares(gpu.upload(a, {n}, dt()));
    EXPECT_NEAR(got, want, 1e-12 * want) << "sum_squares n " << n;
    EXPECT_EQ(got, k::sum_squares(gpu.upload(a, {n}, dt()))) << "sum_squares varies";
  }
}

// The device accumulators of the step's one readback: sum_into and sum_squares_into add
// what the CPU computes, in a fixed order, and make the host wait for nothing (the
// counter of core/device_memory.h; a first call may grow the scratch buffer, which waits).
TEST_P(CudaKernel, SumIntoAddsOnTheDeviceWithoutWaiting) {
  const Tensor totals = gpu.alloc({2}, DType::F64);
  const Tensor sum_total = view_of(totals.data, {1}, DType::F64, Device::CUDA);
  const Tensor squares_total =
      view_of(static_cast<double*>(totals.data) + 1, {1}, DType::F64, Device::CUDA);
  k::sum_squares_into(squares_total, gpu.upload(rand(1 << 20), {1 << 20}, dt()));  // warm-up
  for (int64_t n : kFlatSizes) {
    const auto a = rand(n);
    const Tensor ga = gpu.upload(a, {n}, dt());
    const double start[2] = {0.5, -2.0};
    copy_bytes(totals.data, Device::CUDA, start, Device::CPU, sizeof start);
    const int64_t waits = device_waits();
    k::sum_into(sum_total, ga, 0.25);
    k::sum_squares_into(squares_total, ga);
    k::sum_squares_into(squares_total, ga);
    EXPECT_EQ(device_waits(), waits) << "n " << n << ": the host waited";
    double got[2] = {0, 0};
    copy_bytes(got, Device::CPU, totals.data, Device::CUDA, sizeof got);
    double want_sum = 0.0, want_squares = 0.0;
    for (float x : a) want_sum += x;
    for (float x : a) want_squares += double(x) * x;
    EXPECT_NEAR(got[0], 0.5 + 0.25 * want_sum, 1e-12 * (1.0 + std::abs(want_squares)))
        << "sum_into n " << n;
    EXPECT_NEAR(got[1], -2.0 + 2.0 * want_squares, 1e-12 * (1.0 + want_squares))
        << "sum_squares_into n " << n;
  }
}

TEST_F(CudaOps, ConvertRoundsToNearestEven) {
  // Ties, values just off ties, the largest and smallest floats, infinities, -0.
  std::vector<float> x = to_float(randn(10000, 31, 100.0));
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0x00000001u,
                        0x7f800000u, 0xff800000u, 0x80000000u})
    x.push_back(std::bit_cast<float>(bits));
  const int64_t n = static_cast<int64_t>(x.size());
  const Tensor gx = gpu.upload(x, {n}, DType::F32), gb = gpu.poisoned({n}, DType::BF16);
  k::convert(gb, gx);
  std::vector<uint16_t> bits(x.size());
  copy_bytes(bits.data(), Device::CPU, gb.data, Device::CUDA, gb.bytes());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(bits[i], float_to_bf16(x[i])) << "value " << x[i] << " at " << i;
  const Tensor back = gpu.poisoned({n}, DType::F32);
  k::convert(back, gb);
  const auto values = download(back);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(values[i]), std::bit_cast<uint32_t>(bf16_to_float(bits[i])));
}

TEST_F(CudaOps, AdamWMatchesTheCpu) {
  const int64_t n = 100003;
  for (int64_t step : {1, 2, 10, 1000}) {
    const auto p0 = to_float(randn(n, 41)), m0 = to_float(randn(n, 42, 0.01));
    auto v0 = to_float(randn(n, 43, 0.001));
    for (float& v : v0) v = v * v;
    const auto g = to_float(randn(n, 44));
    std::vector<float> p = p0, m = m0, v = v0;
    k::adamw_update(view(p, {n}), view(m, {n}), view(v, {n}), view(g, {n}), 3e-4f, 0.9f, 0.95f,
                    1e-8f, 0.1f, step);
    const Tensor gp = gpu.upload(p0, {n}, DType::F32), gm = gpu.upload(m0, {n}, DType::F32);
    const Tensor gv = gpu.upload(v0, {n}, DType::F32);
    k::adamw_update(gp, gm, gv, gpu.upload(g, {n}, DType::F32), 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                    step);
    expect_close("adamw params step " + std::to_string(step), download(gp), p, 1e-6);
    expect_close("adamw m", download(gm), m, 1e-6);
    expect_close("adamw v", download(gv), v, 1e-6);
    // Out of place (swap snapshots): the same bits as in place, and the input untouched.
    const Tensor op = gpu.upload(p0, {n}, DType::F32), om = gpu.upload(m0, {n}, DType::F32);
    const Tensor ov = gpu.upload(v0, {n}, DType::F32);
    const Tensor np = gpu.upload(p0, {n}, DType::F32), nm = gpu.upload(m0, {n}, DType::F32);
    const Tensor nv = gpu.upload(v0, {n}, DType::F32);
    k::adamw_update({op, om, ov}, {np, nm, nv}, gpu.upload(g, {n}, DType::F32), 3e-4f, 0.9f, 0.95f,
                    1e-8f, 0.1f, step);
    EXPECT_EQ(download(np), download(gp)) << "out of place: params";
    EXPECT_EQ(download(nm), download(gm)) << "out of place: m";
    EXPECT_EQ(download(nv), download(gv)) << "out of place: v";
    EXPECT_EQ(download(op), p0) << "out of place: the input is left as it was";
  }
}

// ---- the door ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no exception";
}

TEST_F(CudaOps, WrongDtypesDevicesAndShapesAreRefused) {
  const Tensor f64 = gpu.alloc({4}, DType::F64), f32 = gpu.alloc({4}, DType::F32);
  EXPECT_NE(error_of([&] { k::scale(f64, 2.0f); }).find("want f32 or bf16 on CUDA"),
            std::string::npos);
  const Tensor bf = gpu.alloc({4}, DType::BF16);
  EXPECT_NE(error_of([&] { k::add(f32, f32, bf); }).find("bf16"), std::string::npos);
  std::vector<float> host(4);
  EXPECT_NE(error_of([&] { k::add(f32, f32, view(host, {4})); }).find("CPU tensor"),
            std::string::npos);
  // Statistics are F32 even with BF16 data.
  const Tensor x = gpu.alloc({2, 2}, DType::BF16), w = gpu.alloc({2}, DType::BF16);
  const Tensor bf_rstd = gpu.alloc({2}, DType::BF16);
  EXPECT_NE(error_of([&] { k::rmsnorm_forward(x, bf_rstd, x, w, 1e-5f); }).find("want f32 on CUDA"),
            std::string::npos);
  // So are the MoE combine's weights.
  const Tensor pos = gpu.alloc({2, 1}, DType::I32), bf_w = gpu.alloc({2, 1}, DType::BF16);
  EXPECT_NE(error_of([&] { k::moe_unpermute(x, x, pos, bf_w, false); }).find("want f32 on CUDA"),
            std::string::npos);
  // head_dim above what the kernels take (256).
  const Tensor q = gpu.alloc({1, 2, 1, 264}, DType::F32);
  EXPECT_NE(error_of([&] { k::attention_forward(q, Tensor{}, q, q, q); }).find("head_dim 264"),
            std::string::npos);
  // A CUDA tensor over host memory.
  Tensor fake = view(host, {4});
  fake.device = Device::CUDA;
  EXPECT_NE(error_of([&] { k::scale(fake, 2.0f); }).find("not CUDA device memory"),
            std::string::npos);
}

TEST_F(CudaOps, DeviceArenasAllocateAndZero) {
  Arena arena("device", 1000, Device::CUDA);
  const Tensor t = arena.alloc({250}, DType::F32);
  EXPECT_EQ(t.device, Device::CUDA);
  device_fill_ones(arena.base(), arena.capacity());
  arena.zero();
  for (float v : download(t)) ASSERT_EQ(v, 0.0f);
  Arena moved = std::move(arena);
  EXPECT_EQ(moved.base(), t.data);
}

}  // namespace
}  // namespace pentad::cuda_kernels
