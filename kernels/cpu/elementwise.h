#pragma once
// CPU kernels of the elementwise utilities (add, scale, sum of squares) and the AdamW step,
// behind kernels/elementwise.cpp and kernels/optim.cpp; raw pointers and sizes, checked at
// the door (kernels/door.h).
#include <cstdint>

namespace pentad::kernels::cpu {

// out = a + b over n values; out may alias a or b.
template <typename T>
void add(T* out, const T* a, const T* b, int64_t n);
// x *= s over n values.
template <typename T>
void scale(T* x, T s, int64_t n);
// sum of x^2, accumulated in double in a fixed order for a fixed thread count.
template <typename T>
double sum_squares(const T* x, int64_t n);
// sum of x in double, in index order.
template <typename T>
double sum(const T* x, int64_t n);

// One AdamW step over n values, in torch.optim.AdamW's order (single-tensor path):
//   p *= 1 - lr * wd;  m = lerp(m, g, 1 - b1);  v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// reading params, m, v and writing params_out, m_out, v_out (the same arrays for an update
// in place; element i is read before it is written).
template <typename T>
void adamw_update(const T* params, const T* m, const T* v, T* params_out, T* m_out, T* v_out,
                  const T* grads, int64_t n, double lr, double beta1, double beta2, double eps,
                  double weight_decay, int64_t step);

}  // namespace pentad::kernels::cpu
