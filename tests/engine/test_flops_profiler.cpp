// engine/flops_profiler.h's op counter on its own: DeepSpeed's rules op by op, exact, in this
// process (the profiler inside a training run: tests/examples/test_examples_training.cpp).
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/conv2d.h>
#include <catch2/catch.hpp>

#include <thread>

#include "engine/flops_profiler.h"

using tessera::OpCount;
using tessera::OpCounter;

namespace {

struct Tally {
  OpCount total;
  int ops = 0;
  OpCounter counter{[this](const OpCount& n) {
    total.flops += n.flops;
    total.macs += n.macs;
    ++ops;
  }};
};

}  // namespace

TEST_CASE("flops counter: a linear layer is counted exactly and once (not again for the addmm inside it)") {
  const at::Tensor x = at::randn({3, 7, 48}), w = at::randn({80, 48}), b = at::randn({80});
  Tally t;
  at::linear(x, w, b);
  CHECK(t.ops == 1);
  CHECK(t.total.macs == 3 * 7 * 48 * 80);
  CHECK(t.total.flops == 2 * t.total.macs);
}

TEST_CASE("flops counter: matmul - attention - layer norm - gelu - convolution by DeepSpeed's rules") {
  Tally t;
  SECTION("matmul of a batch: numel(a) times b's columns") {
    at::matmul(at::randn({2, 5, 6}), at::randn({2, 6, 9}));
    CHECK(t.total.macs == 2 * 5 * 6 * 9);
    CHECK(t.ops == 1);
  }
  SECTION("scaled dot-product attention: the scores and the weighted values, causal or not") {
    const at::Tensor q = at::randn({2, 4, 16, 8}), k = at::randn({2, 4, 16, 8}), v = at::randn({2, 4, 16, 8});
    at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    CHECK(t.total.macs == q.numel() * 16 + 2 * 4 * 16 * 16 * 8);
    CHECK(t.ops == 1);  // the softmax and matmuls of its math path are inside it
  }
  SECTION("layer norm: 5 flops an element with a weight, 4 without; gelu one") {
    const at::Tensor x = at::randn({4, 10});
    at::layer_norm(x, {10}, at::randn({10}), at::randn({10}));
    CHECK(t.total.flops == 5 * 40);
    at::layer_norm(x, {10});
    CHECK(t.total.flops == 9 * 40);
    at::gelu(x);
    CHECK(t.total.flops == 10 * 40);
    CHECK(t.total.macs == 0);
  }
  SECTION("convolution: each output element costs in_channels / groups x kernel MACs") {
    at::conv2d(at::randn({2, 3, 10, 10}), at::randn({5, 3, 3, 3}));
    CHECK(t.total.macs == (2 * 5 * 8 * 8) * (3 * 3 * 3));
    CHECK(t.ops == 1);
  }
}

TEST_CASE("flops counter: paused counts nothing - another thread's ops count nothing - one counter a thread") {
  Tally t;
  const at::Tensor x = at::randn({4, 8}), w = at::randn({8, 8});
  t.counter.set_paused(true);
  at::linear(x, w);
  CHECK(t.ops == 0);
  t.counter.set_paused(false);
  std::thread([&] { at::linear(x, w); }).join();
  CHECK(t.ops == 0);
  at::linear(x, w);
  CHECK(t.total.macs == 4 * 8 * 8);
  CHECK_THROWS_WITH(OpCounter([](const OpCount&) {}), Catch::Contains("a second flops counter"));
}
