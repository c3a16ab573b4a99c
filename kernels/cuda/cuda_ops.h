#pragma once
// The CUDA backend behind kernels/ops.h. The op-family doors (kernels/linear.cpp, ...) check
// every argument (device, dtype, shape) and call these only in builds with CUDA, for calls
// whose tensors are all CUDA tensors (kernels/door.h); this header needs no CUDA headers so
// that builds without CUDA still compile the doors.
//
// Element types (checked at the door): the data of a call (activations, weights and the
// gradients of activations) share one of F32 or BF16; per-row statistics (mean, rstd, lse,
// losses, row_max, stats), parameter gradients (dweight, dbias, dwte, dwpe) and the AdamW
// tensors are F32. Every kernel accumulates in F32 (sum_squares in F64).
//
// Stream rule: every kernel and cuBLASLt call runs on the legacy default stream (the
// compute stream), in issue order, so it is ordered with cudaMemcpy. NCCL runs on each
// communicator's own non-blocking stream, ordered against this one with events
// (parallel/comm.h); checkpoint copies run on AsyncCopier's stream (core/device_memory.h).
// One host thread drives a device (the scratch buffer below assumes it).
//
// Determinism: every kernel is bitwise deterministic for a fixed shape (no floating-point
// atomics; reductions in a fixed order). cuBLASLt is deterministic for a fixed algorithm,
// which is cached per shape.
#include <cstdint>

#include "core/tensor.h"

namespace pentad::kernels::cuda {

// The largest attention head_dim the CUDA attention kernels take: pentad's kernel up to 256
// (tiling.h: cells in shared memory above 128), cuDNN's on Hopper up to 256 in multiples of 8.
constexpr int64_t kMaxHeadDim = 256;

// Fails with a message unless t's memory is CUDA device (or managed) memory.
void require_device_memory(const char* op, const char* name, const Tensor& t);

// Op timing (kernels/op_profile.h): record_timing_event() records an event of a pool on the
// compute stream and returns its index; timing_event_seconds() waits for the later of two and
// returns the time between them; recycle_timing_events() gives every event back to the pool.
int record_timing_event();
double timing_event_seconds(int from, int to);
void recycle_timing_events();

// The version of the cuBLASLt library linear_*() use, opening it as their first call does
// (no device needed); fails naming the library when it does not load.
size_t cublaslt_version();

void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    int64_t N, int64_t C, int64_t OC);
void linear_gelu_forward(const Tensor& out, const Tensor& pre_gelu, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                         int64_t OC);
void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& inp, const Tensor& weight, int64_t N,
                     int64_t C, int64_t OC, bool accumulate_dinp);
void linear_backward_gelu(const Tensor& dpre_gelu, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& pre_gelu, int64_t N, int64_t C, int64_t OC);

// residual/a/b absent: plain norm of inp. With a and b: residual = a + b, normalised.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, int64_t N, int64_t C, float eps);
void residual_layernorm_forward(const Tensor& residual, const Tensor& out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b,
                                const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                                float eps);
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& inp, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C);
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     int64_t N, int64_t C, float eps);
void residual_rmsnorm_forward(const Tensor& residual, const Tensor& out, const Tensor& rstd,
                              const Tensor& a, const Tensor& b, const Tensor& weight, int64_t N,
                              int64_t C, float eps);
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                      const Tensor& inp, const Tensor& weight, const Tensor& rstd, int64_t N,
                      int64_t C);

void gelu_forward(const Tensor& out, const Tensor& inp, int64_t n);
void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp, int64_t n);
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, int64_t n);
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, int64_t n);

// Positions (I32 on the device) may be absent: token t is at pos_offset + t (rope), at t
// (attention, embedding). They are not checked on the host (ascending, in range): that
// would need a copy and a wait.
void rope_apply(const Tensor& x, const Tensor& positions, int64_t B, int64_t T, int64_t H,
                int64_t D, int64_t pos_offset, float theta, bool inverse);

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& q_pos, const Tensor& k_pos, int64_t B,
                       int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos, int64_t B,
                        int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                        bool accumulate);
// out, block_out (B, T, H, D) in the data type; lse, block_lse (B, H, T) F32.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse, int64_t B, int64_t T, int64_t H, int64_t D);

// Targets outside [0, V) are not checked on the host (that would need a copy and a wait):
// their loss is NaN and their row gets no one-hot term.
void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                   const Tensor& logits, const Tensor& targets, int64_t N,
                                   int64_t V, float dloss);
void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t N, int64_t Vl);
void vocab_parallel_ce_stats(const Tensor& stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t N, int64_t Vl, int64_t vocab_start);
void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t N, int64_t Vl, int64_t vocab_start, float dloss);

// vocab_start < 0: the whole table; a token outside [0, V) gives a NaN row (no host check).
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, const Tensor& positions, int64_t B, int64_t T, int64_t C,
                       int64_t V, int64_t vocab_start);
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, const Tensor& positions, int64_t B, int64_t T,
                        int64_t C, int64_t V, int64_t vocab_start);

// MoE token permutation: one thread per output element (a warp per pick for the backward's
// dot products), each sum over a token's picks in pick order. inp_rows bounds the ids, which
// are not checked on the host: a src or pos past the end of inp gives NaN, as a bad token id
// does; pos < 0 is a dropped pick. w and dw are F32.
void moe_permute(const Tensor& out, const Tensor& inp, const Tensor& src, int64_t A, int64_t C,
                 int64_t inp_rows);
void moe_unpermute(const Tensor& out, const Tensor& inp, const Tensor& pos, const Tensor& w,
                   int64_t N, int64_t k, int64_t C, int64_t inp_rows, bool accumulate);
void moe_unpermute_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                            const Tensor& inp, const Tensor& pos, const Tensor& w, int64_t N,
                            int64_t k, int64_t C, int64_t inp_rows);

void add(const Tensor& out, const Tensor& a, const Tensor& b, int64_t n);
void scale(const Tensor& x, float s, int64_t n);
double sum_squares(const Tensor& x, int64_t n);  // reads back: the host waits
// *total (one F64 in device memory) += scale * sum of x, or of x^2; no readback.
void sum_into(const Tensor& total, const Tensor& x, int64_t n, double scale, bool squares);
void convert(const Tensor& out, const Tensor& inp, int64_t n);
// Reads params, m, v; writes params_out, m_out, v_out (the same tensors for in place).
void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& params_out,
                  const Tensor& m_out, const Tensor& v_out, const Tensor& grads, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);

}  // namespace pentad::kernels::cuda
