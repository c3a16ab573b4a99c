#pragma once
// Helpers shared by the kernel tests: tensors over std::vector storage, seeded random
// data, and the finite-difference gradient check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace pentad::testing {

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else
    return DType::I32;
}

// A tensor viewing v (which must outlive it) with the given shape.
template <typename T>
Tensor view(const std::vector<T>& v, Shape shape) {
  EXPECT_EQ(static_cast<int64_t>(v.size()), shape.numel()) << "test bug: storage vs shape";
  Tensor t;
  t.data = const_cast<T*>(v.data());
  t.dtype = dtype_of<T>();
  t.shape = shape;
  return t;
}

inline std::vector<double> randn(size_t n, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}
inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

// max |a - b| / max(|b|, floor): a relative error against the reference b.
template <typename A, typename B>
double rel_error(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-30) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, ref = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return err / ref;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Compares analytic, the backward pass's gradient of objective() with respect to x, to
// central differences at up to max_checks evenly spread entries of x. objective() must
// read x. The error is relative to the largest numerical gradient, which must be nonzero.
inline void expect_gradient(const std::string& name, std::vector<double>& x,
                            const std::vector<double>& analytic,
                            const std::function<double()>& objective, size_t max_checks = 400,
                            double tol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  const double h = 1e-5;
  const size_t stride = std::max<size_t>(1, x.size() / max_checks);
  double max_err = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus_ = objective();
    x[i] = saved;
    const double numerical = (plus - minus_) / (2 * h);
    const double err = std::abs(numerical - analytic[i]);
    if (err > max_err) max_err = err, worst = i;
    max_ref = std::max(max_ref, std::abs(numerical));
  }
  ASSERT_GT(max_ref, 0.0) << name << ": the objective does not depend on it";
  EXPECT_LT(max_err / max_ref, tol) << name << ": worst at index " << worst << ", analytic "
                                    << analytic[worst] << ", max |grad| " << max_ref;
}

// n ids uniform in [0, V): targets, or tokens (a small V makes rows repeat).
inline std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return ids;
}

}  // namespace pentad::testing
