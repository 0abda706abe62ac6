// SplitBackward (parallel/pipeline/split_backward.h): B gives the input's gradient and leaves the
// weights untouched; W then gives the weights exactly a whole backward's gradients, running only
// the weight-gradient products (counted through a hook on each weight); a weight used twice falls
// back to the whole backward in W, still exact.
#include <catch2/catch.hpp>

#include <ATen/ops/allclose.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/autograd.h>

#include "parallel/pipeline/split_backward.h"

using tessera::pipeline::SplitBackward;

namespace {

struct Stage {
  std::vector<at::Tensor> weights;
  bool shared = false;  // the first linear's weight used again at the end
  Stage() {
    at::manual_seed(3);
    for (auto shape : std::vector<std::vector<int64_t>>{{8, 8}, {8}, {8}, {8}, {16, 8}, {16}, {8, 16}})
      weights.push_back(at::randn(shape).requires_grad_(true));
  }
  at::Tensor forward(const at::Tensor& x) const {
    const auto& w = weights;
    at::Tensor h = at::linear(x, w[0], w[1]);
    h = at::layer_norm(h, {8}, w[2], w[3]);
    h = at::gelu(at::linear(h, w[4], w[5]));
    h = at::linear(h, w[6]);
    return shared ? at::linear(h, w[0]) : h;
  }
};

}  // namespace

TEST_CASE("SplitBackward: B gives the input's gradient - W the weights' - both as a whole backward's", "[pipeline]") {
  for (bool shared : {false, true}) {
    INFO("a weight used twice: " << shared);
    Stage stage;
    stage.shared = shared;
    const at::Tensor x = at::randn({4, 3, 8}), g = at::randn({4, 3, 8});
    // The reference: one whole backward.
    at::Tensor x_ref = x.clone().requires_grad_(true);
    torch::autograd::backward({stage.forward(x_ref)}, {g});
    std::vector<at::Tensor> expected;
    for (at::Tensor& w : stage.weights) {
      expected.push_back(w.grad().clone());
      w.mutable_grad() = at::Tensor();
    }
    // Split: each weight's gradient must arrive in W, not B.
    int arrived = 0;
    for (at::Tensor& w : stage.weights) w.register_hook([&arrived](const at::Tensor&) { ++arrived; });
    at::Tensor x_split = x.clone().requires_grad_(true);
    SplitBackward split({stage.forward(x_split)}, {g}, x_split);
    CHECK(split.split() == !shared);
    CHECK(at::allclose(split.input_gradient(), x_ref.grad(), 1e-5, 1e-6));
    if (!shared) {
      CHECK(arrived == 0);
      for (const at::Tensor& w : stage.weights) CHECK(!w.grad().defined());
    }
    split.weights();
    CHECK(arrived >= static_cast<int>(stage.weights.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("weight " << i);
      REQUIRE(stage.weights[i].grad().defined());
      CHECK(at::allclose(stage.weights[i].grad(), expected[i], 1e-5, 1e-6));
    }
    CHECK_THROWS_WITH(split.weights(), Catch::Contains("ran twice"));
  }
}
