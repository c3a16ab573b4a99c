#pragma once
// NumPy .npy files (format 1.0, little-endian, C order): how pentad hands tensors to the
// PyTorch reference tests and to people inspecting a run.
#include <string>

#include "core/tensor.h"

namespace pentad {

// Writes t (F32, F64 or I32, CPU) to path; throws pentad::Error naming the file on failure.
void write_npy(const std::string& path, const Tensor& t);

}  // namespace pentad
