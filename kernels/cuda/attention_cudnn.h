#pragma once
// cuDNN's fused flash attention (attention_cudnn.cpp), beside pentad's own kernels of
// cuda_ops.h, for the plain causal case: no positions, Tq == Tk == T, the layouts and
// element types of cuda_ops.h's attention_forward/backward (BF16 goes to cuDNN as is; F32
// is staged through BF16 copies). The attention door (kernels/attention.cpp) picks between
// the two (train.attention). Like cuda_ops.h, this header needs no CUDA header.
//
// Graphs are built once per (device, direction, shape) and cached with their workspace.
// supported() builds the graph of that direction if needed and says whether cuDNN takes
// the shape (why not, in *why); forward/backward fail with that reason when it does not.
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace pentad::kernels::cuda {

bool cudnn_attention_supported(bool backward, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                               int64_t D, std::string* why);
void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t D);
void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, int64_t B, int64_t T,
                              int64_t Hq, int64_t Hkv, int64_t D, bool accumulate);
// Graphs built so far on any device, refused shapes included (the cache test: a second call
// of a shape builds none).
int64_t cudnn_attention_graphs_built();

}  // namespace pentad::kernels::cuda
