// Linear layers through cuBLASLt. One handle and one workspace per device, created on first
// use; the algorithm for each GEMM shape is chosen once by cuBLASLt's heuristic and cached.
// Row-major tensors are column-major transposes, so out (N, OC) = inp (N, C) @ W (OC, C)^T is
// the column-major D (OC, N) = op_T(W) (OC, C) @ inp (C, N).
//
// F32 runs with CUBLAS_COMPUTE_32F (no TF32), BF16 inputs with F32 accumulation. Parameter
// gradients (dweight, dbias) are F32 whatever the data type.
//
// cuBLASLt is opened (dlopen) at the first GEMM, not linked: loading its 540 MB library costs
// about 0.1 s of CPU in page faults (its relocations), which every process of a CPU run paid
// for nothing, each rank and each test program (about 25,000 minor faults a start).
#include <cublasLt.h>
#include <dlfcn.h>

#include <array>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/device_memory.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

// The cuBLASLt functions used here, from the library opened on first use.
struct LtApi {
  decltype(&cublasLtCreate) Create = nullptr;
  decltype(&cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&cublasLtGetVersion) GetVersion = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
};

const LtApi& lt_api() {
  static const LtApi api = [] {
    const std::string name = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) fail("the CUDA backend's GEMMs need {}, which did not load: {}", name, dlerror());
    LtApi api;
    auto load = [&](auto& function, const char* symbol) {
      function =
          reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, symbol));
      if (!function) fail("{} has no {}: {}", name, symbol, dlerror());
    };
    load(api.Create, "cublasLtCreate");
    load(api.GetStatusString, "cublasLtGetStatusString");
    load(api.GetVersion, "cublasLtGetVersion");
    load(api.Matmul, "cublasLtMatmul");
    load(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    load(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
    load(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    load(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    load(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    load(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    load(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    load(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    load(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    return api;
  }();
  return api;
}

}  // namespace

size_t cublaslt_version() {
  return lt_api().GetVersion();
}

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS recommends for Hopper
constexpr int kMaxDevices = 64;
constexpr int kThreads = 256;

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error in {}: {}", what, lt_api().GetStatusString(status));
}

cudaDataType_t data_type(DType dtype) {
  return dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// A GEMM in cuBLASLt's column-major terms: D (m, n) = op(A) (m, k) @ op(B) (k, n) + beta D,
// then the epilogue. A is stored (k, m) when trans_a, else (m, k); B likewise.
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  cudaDataType_t ab_type = CUDA_R_32F, d_type = CUDA_R_32F;
  float beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // (m) in d_type, for the *BIAS epilogues
  void* aux = nullptr;         // (m, n) with leading dimension ldd: GELU input, for *GELU_AUX*
};

using GemmKey = std::array<int64_t, 16>;

struct DeviceLt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<GemmKey, cublasLtMatmulAlgo_t> algorithms;
};

// The current device's handle and workspace, created on first use and kept for the process.
DeviceLt& device_lt() {
  static std::array<DeviceLt, kMaxDevices> devices;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  PENTAD_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {}", device);
  DeviceLt& lt = devices[static_cast<size_t>(device)];
  if (!lt.handle) {
    check_lt(lt_api().Create(&lt.handle), "cublasLtCreate");
    lt.workspace = device_alloc(kWorkspaceBytes, "the cuBLASLt workspace");
  }
  return lt;
}

// RAII owners of the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference) lt_api().MatmulPreferenceDestroy(preference);
    if (d) lt_api().MatrixLayoutDestroy(d);
    if (b) lt_api().MatrixLayoutDestroy(b);
    if (a) lt_api().MatrixLayoutDestroy(a);
    if (matmul) lt_api().MatmulDescDestroy(matmul);
  }
};

template <typename V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  check_lt(lt_api().MatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
           "cublasLtMatmulDescSetAttribute");
}
template <typename V>
void set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
         const V& value) {
  check_lt(lt_api().MatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
           "cublasLtMatmulPreferenceSetAttribute");
}

// Runs g; returns false, having run nothing, when cuBLASLt has no algorithm for it (callers
// with an epilogue then fall back to a plain GEMM and a separate kernel).
bool try_matmul(const Gemm& g) {
  DeviceLt& lt = device_lt();
  Descriptors desc;
  check_lt(lt_api().MatmulDescCreate(&desc.matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(desc.matmul, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set(desc.matmul, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias) set(desc.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) {
    set(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldd);
  }
  const auto rows = [](bool trans, int64_t r, int64_t c) { return trans ? c : r; };
  check_lt(lt_api().MatrixLayoutCreate(&desc.a, g.ab_type, rows(g.trans_a, g.m, g.k),
                                       rows(g.trans_a, g.k, g.m), g.lda),
           "cublasLtMatrixLayoutCreate (A)");
  check_lt(lt_api().MatrixLayoutCreate(&desc.b, g.ab_type, rows(g.trans_b, g.k, g.n),
                                       rows(g.trans_b, g.n, g.k), g.ldb),
           "cublasLtMatrixLayoutCreate (B)");
  check_lt(lt_api().MatrixLayoutCreate(&desc.d, g.d_type, g.m, g.n, g.ldd),
           "cublasLtMatrixLayoutCreate (D)");

  const int align_a = pointer_alignment(g.a), align_b = pointer_alignment(g.b);
  const int align_d = pointer_alignment(g.d);
  const int align_e =
      std::min(g.bias ? pointer_alignment(g.bias) : 256, g.aux ? pointer_alignment(g.aux) : 256);
  const GemmKey key = {g.trans_a, g.trans_b, g.m,       g.n,           g.k,        g.lda,
                       g.ldb,     g.ldd,     g.ab_type, g.d_type,      g.epilogue, align_a,
                       align_b,   align_d,   align_e,   g.beta != 0.0f};
  auto found = lt.algorithms.find(key);
  if (found == lt.algorithms.end()) {
    check_lt(lt_api().MatmulPreferenceCreate(&desc.preference), "cublasLtMatmulPreferenceCreate");
    set(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
    set(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(align_a));
    set(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(align_b));
    set(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(align_d));
    set(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(align_d));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int returned = 0;
    const cublasStatus_t status =
        lt_api().MatmulAlgoGetHeuristic(lt.handle, desc.matmul, desc.a, desc.b, desc.d, desc.d,
                                        desc.preference, 1, &heuristic, &returned);
    if (status != CUBLAS_STATUS_SUCCESS || returned == 0) return false;
    found = lt.algorithms.emplace(key, heuristic.algo).first;
  }
  const float alpha = 1.0f;
  check_lt(
      lt_api().Matmul(lt.handle, desc.matmul, &alpha, g.a, desc.a, g.b, desc.b, &g.beta, g.d,
                      desc.d, g.d, desc.d, &found->second, lt.workspace, kWorkspaceBytes, stream()),
      "cublasLtMatmul");
  return true;
}

void matmul(const Gemm& g, const char* what) {
  if (!try_matmul(g))
    fail("{}: cuBLASLt has no algorithm for a {}x{}x{} GEMM (types {}/{})", what, g.m, g.n, g.k,
         static_cast<int>(g.ab_type), static_cast<int>(g.d_type));
}

// Column sums of x (N, C) over one chunk of rows per blockIdx.y (tiling.h).
template <typename T>
__global__ void column_sums_kernel(float* partials, const T* x, int64_t N, int64_t C,
                                   int64_t chunk_rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * chunk_rows, r1 = min(N, r0 + chunk_rows);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f32(x[r * C + c]);
  partials[chunk * C + c] = acc;
}

// out (N, OC) = bias, or 0: a linear layer with no input features.
template <typename T>
__global__ void fill_rows_kernel(T* out, const T* bias, int64_t N, int64_t OC) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * OC;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = bias ? bias[i % OC] : from_f32<T>(0.0f);
}

// The forward GEMM of out = inp @ weight^T (+ bias), with the given epilogue.
Gemm forward_gemm(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                  int64_t N, int64_t C, int64_t OC) {
  Gemm g;
  g.trans_a = true;
  g.m = OC, g.n = N, g.k = C;
  g.a = weight.data, g.lda = C;
  g.b = inp.data, g.ldb = C;
  g.d = out.data, g.ldd = OC;
  g.ab_type = g.d_type = data_type(out.dtype);
  g.bias = bias.data;
  g.epilogue = bias.data ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  return g;
}

}  // namespace

void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    int64_t N, int64_t C, int64_t OC) {
  if (N == 0 || OC == 0) return;
  if (C == 0) {
    by_dtype(out.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      fill_rows_kernel<T>
          <<<grid_for(N * OC, kThreads), kThreads, 0, stream()>>>(ptr<T>(out), ptr<T>(bias), N, OC);
    });
    check_launch("linear_forward");
    return;
  }
  matmul(forward_gemm(out, inp, weight, bias, N, C, OC), "linear_forward");
}

void linear_gelu_forward(const Tensor& out, const Tensor& pre_gelu, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                         int64_t OC) {
  if (N == 0 || OC == 0) return;
  // cuBLASLt's GELU epilogue (the tanh approximation) writes its input to an auxiliary
  // buffer whose leading dimension must be a multiple of 8.
  if (C > 0 && OC % 8 == 0) {
    Gemm g = forward_gemm(out, inp, weight, bias, N, C, OC);
    g.epilogue = bias.data ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    g.aux = pre_gelu.data;
    if (try_matmul(g)) return;
  }
  linear_forward(pre_gelu, inp, weight, bias, N, C, OC);
  gelu_forward(out, pre_gelu, N * OC);
}

void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& inp, const Tensor& weight, int64_t N,
                     int64_t C, int64_t OC, bool accumulate_dinp) {
  if (dinp.data && N > 0 && C > 0) {
    if (OC == 0) {
      if (!accumulate_dinp)
        check(cudaMemsetAsync(dinp.data, 0, dinp.bytes(), stream()), "cudaMemsetAsync");
    } else {
      // dinp (N, C) = dout (N, OC) @ W (OC, C): column-major D (C, N) = W (C, OC) @ dout (OC, N).
      Gemm g;
      g.m = C, g.n = N, g.k = OC;
      g.a = weight.data, g.lda = C;
      g.b = dout.data, g.ldb = OC;
      g.d = dinp.data, g.ldd = C;
      g.ab_type = g.d_type = data_type(dout.dtype);
      g.beta = accumulate_dinp ? 1.0f : 0.0f;
      matmul(g, "linear_backward (dinp)");
    }
  }
  if (dweight.data && N > 0 && OC > 0 && C > 0) {
    // dweight (OC, C) += dout^T @ inp: column-major D (C, OC) += inp (C, N) @ op_T(dout) (N, OC).
    Gemm g;
    g.trans_b = true;
    g.m = C, g.n = OC, g.k = N;
    g.a = inp.data, g.lda = C;
    g.b = dout.data, g.ldb = OC;
    g.d = dweight.data, g.ldd = C;
    g.ab_type = data_type(dout.dtype);
    g.d_type = CUDA_R_32F;
    g.beta = 1.0f;
    matmul(g, "linear_backward (dweight)");
  }
  if (dbias.data && N > 0 && OC > 0) {
    const int64_t chunk_rows = column_chunk_rows(N), chunks = column_chunks(N);
    float* partials = static_cast<float*>(scratch(chunks * OC * sizeof(float)));
    const dim3 grid(static_cast<unsigned>(ceil_div(OC, kThreads)), static_cast<unsigned>(chunks));
    by_dtype(dout.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      column_sums_kernel<T>
          <<<grid, kThreads, 0, stream()>>>(partials, ptr<T>(dout), N, OC, chunk_rows);
    });
    check_launch("linear_backward (dbias)");
    add_column_partials(ptr<float>(dbias), partials, chunks, OC);
  }
}

void linear_backward_gelu(const Tensor& dpre_gelu, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& pre_gelu, int64_t N, int64_t C, int64_t OC) {
  linear_backward(Tensor{}, dweight, dbias, dout, inp, weight, N, C, OC, false);
  if (N == 0 || C == 0) return;
  // dpre_gelu = (dout @ W) * gelu'(pre_gelu): the dinp GEMM of linear_backward with the DGELU
  // epilogue reading pre_gelu (leading dimension C, which must be a multiple of 8).
  if (OC > 0 && C % 8 == 0) {
    Gemm g;
    g.m = C, g.n = N, g.k = OC;
    g.a = weight.data, g.lda = C;
    g.b = dout.data, g.ldb = OC;
    g.d = dpre_gelu.data, g.ldd = C;
    g.ab_type = g.d_type = data_type(dout.dtype);
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.aux = pre_gelu.data;
    if (try_matmul(g)) return;
  }
  linear_backward(dpre_gelu, Tensor{}, Tensor{}, dout, inp, weight, N, C, OC, false);
  gelu_backward(dpre_gelu, dpre_gelu, pre_gelu, N * C);
}

}  // namespace pentad::kernels::cuda
