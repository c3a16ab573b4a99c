#include "kernels/cpu/convert.h"

#include "core/bf16.h"
#include "kernels/cpu/common.h"

namespace pentad::kernels::cpu {

namespace {

// Every value goes through double, which holds F32, F64 and BF16 values exactly.
double load(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F64:
      return static_cast<const double*>(p)[i];
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

void store(void* p, DType dtype, int64_t i, double value) {
  switch (dtype) {
    case DType::F64:
      static_cast<double*>(p)[i] = value;
      break;
    case DType::BF16:
      // F64 -> BF16 rounds twice, through F32.
      static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(value));
      break;
    default:
      static_cast<float*>(p)[i] = static_cast<float>(value);
      break;
  }
}

}  // namespace

void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) store(out, out_dtype, i, load(inp, inp_dtype, i));
}

}  // namespace pentad::kernels::cpu
