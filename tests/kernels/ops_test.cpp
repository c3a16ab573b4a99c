// The door checks of kernels/ops.h: wrong device, dtype or shape never reaches a kernel.
#include "kernels/ops.h"

#include "kernel_test_util.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// Runs f, expects it to throw, and returns the message.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

Tensor on_cuda(Tensor t) {
  t.device = Device::CUDA;
  return t;
}

TEST(Ops, CudaTensorsAreRejectedWithAMessage) {
  std::vector<float> a(12), b(12), c(12), w(4 * 3), w3(3), c4(4);
  const std::vector<int32_t> tok = {0, 1, 2, 3};
  const Tensor A = view(a, {4, 3}), B = view(b, {4, 3}), W = view(w, {4, 3});
  const std::vector<std::function<void()>> calls = {
      [&] {
        k::linear_forward(on_cuda(view(c, {4, 3})), A, W, Tensor{});
      },
      [&] {
        k::linear_forward(view(c, {4, 3}), A, on_cuda(W), Tensor{});
      },
      [&] {
        k::layernorm_forward(on_cuda(B), Tensor{}, Tensor{}, A, view(w3, {3}), Tensor{}, 1e-5f);
      },
      [&] { k::gelu_forward(B, on_cuda(A)); },
      [&] { k::add(B, A, on_cuda(B)); },
      [&] { k::scale(on_cuda(A), 2.0f); },
      [&] { k::sum_squares(on_cuda(A)); },
      [&] {
        k::rope_forward(on_cuda(view(a, {1, 2, 3, 2})), 0, 10000.0f);
      },
      [&] {
        k::crossentropy_forward_backward(view(c4, {4}), Tensor{}, A, on_cuda(view(tok, {4})), 1.0f);
      },
      [&] {
        k::embedding_forward(view(c, {1, 4, 3}), on_cuda(view(tok, {1, 4})), W, Tensor{});
      },
      [&] {
        k::attention_forward(view(c, {1, 2, 3, 2}), Tensor{}, on_cuda(view(a, {1, 2, 3, 2})),
                             view(b, {1, 2, 3, 2}), view(b, {1, 2, 3, 2}));
      },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string msg = error_of(calls[i]);
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << "call " << i << ": " << msg;
  }
}

TEST(Ops, ShapeMismatchesAreRejected) {
  std::vector<float> x(5 * 7), w(3 * 6), out(5 * 3), w6(6), o(5 * 7);
  const std::string msg = error_of([&] {
    k::linear_forward(view(out, {5, 3}), view(x, {5, 7}), view(w, {3, 6}), Tensor{});
  });
  EXPECT_NE(msg.find("linear_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(5, 7)"), std::string::npos) << msg;
  // Weight of the wrong width for layernorm; output of the wrong row count for gelu.
  error_of([&] {
    k::layernorm_forward(view(o, {5, 7}), Tensor{}, Tensor{}, view(x, {5, 7}), view(w6, {6}),
                         Tensor{}, 1e-5f);
  });
  error_of([&] { k::gelu_forward(view(out, {5, 3}), view(x, {5, 7})); });
  // Grad of a different shape than its parameter.
  std::vector<float> w2(3 * 7), dw(3 * 6);
  error_of([&] {
    k::linear_backward(Tensor{}, view(dw, {3, 6}), Tensor{}, view(out, {5, 3}), view(x, {5, 7}),
                       view(w2, {3, 7}), false);
  });
}

TEST(Ops, MixedOrNonFloatDtypesAreRejected) {
  std::vector<float> a(6), out(6);
  std::vector<double> b(6);
  std::vector<int32_t> i(6);
  EXPECT_NE(error_of([&] { k::add(view(out, {6}), view(a, {6}), view(b, {6})); }).find("f64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { k::scale(view(i, {6}), 2.0f); }).find("i32"), std::string::npos);
  // Targets must be i32.
  std::vector<float> targets(2), losses(2);
  error_of([&] {
    k::crossentropy_forward_backward(view(losses, {2}), Tensor{}, view(a, {2, 3}),
                                     view(targets, {2}), 1.0f);
  });
}

TEST(Ops, RequiredTensorsMustBePresent) {
  std::vector<float> x(6), out(6);
  const std::string msg = error_of([&] {
    k::linear_forward(view(out, {2, 3}), view(x, {2, 3}), Tensor{}, Tensor{});
  });
  EXPECT_NE(msg.find("weight"), std::string::npos) << msg;
}

}  // namespace
}  // namespace pentad
