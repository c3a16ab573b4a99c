#pragma once
// CPU element-type conversion (F32, F64, BF16), behind kernels/elementwise.cpp. Unlike the
// other CPU kernels it is not a template: it switches on both dtypes itself.
#include <cstdint>

#include "core/tensor.h"

namespace pentad::kernels::cpu {

// out = inp converted element by element between F32, F64 and BF16 (stored as uint16_t);
// to BF16 rounds to nearest even, to F32 from F64 rounds as a static_cast does.
void convert(void* out, DType out_dtype, const void* inp, DType inp_dtype, int64_t n);

}  // namespace pentad::kernels::cpu
