// The MoE dispatch without a group (parallel/moe/dispatch.h): each local expert gets exactly its kept
// choices' tokens, in slot order (no rows padded to the capacity), and combine() returns each token's
// kept choices' expert outputs weighted by the routing weights — against an explicit loop over tokens,
// with a capacity that drops and dropless, top-1 and top-2, forward and the gradients of the tokens
// and the router's logits. The multi-rank all-to-alls are tested end to end (tests/python/moe,
// tests/examples/test_examples_moe.cpp).
#include <catch2/catch.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>
#include <vector>

#include "parallel/moe/dispatch.h"
#include "parallel/moe/gating.h"

using tessera::Dispatch;
using tessera::GateOptions;
using tessera::Routing;

namespace {

constexpr int64_t kTokens = 24, kHidden = 5, kExperts = 4;

// Expert e: x -> tanh(x · (e + 1)), a function of each row on its own.
at::Tensor expert(const at::Tensor& x, int64_t e) { return (x * double(e + 1)).tanh(); }

void check_dispatch(int64_t k, bool drop_tokens) {
  at::manual_seed(11);
  at::Tensor tokens = at::randn({kTokens, kHidden}).requires_grad_(true);
  at::Tensor logits = (at::randn({kTokens, kExperts}) * 2).requires_grad_(true);
  GateOptions o;
  o.k = k, o.drop_tokens = drop_tokens, o.capacity_factor = 0.75, o.min_capacity = 0, o.use_rts = false;
  o.second_expert_sampling = false;
  const Routing r = route(logits, o, /*training=*/true);
  const Dispatch d(tokens, r, nullptr);
  REQUIRE(d.local_experts() == kExperts);

  // The rows each expert got: its kept choices' tokens, by slot.
  const at::Tensor expert_of = r.expert.contiguous(), slot = r.slot.contiguous(), kept = r.kept.contiguous();
  int64_t dropped = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    std::vector<int64_t> by_slot;
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (expert_of[t][j].item<int64_t>() == e && kept[t][j].item<bool>()) {
          const auto s = slot[t][j].item<int64_t>();
          if (int64_t(by_slot.size()) <= s) by_slot.resize(s + 1, -1);
          by_slot[s] = t;
        }
    const at::Tensor& rows = d.expert_inputs()[e];
    REQUIRE(rows.size(0) == int64_t(by_slot.size()));
    for (size_t s = 0; s < by_slot.size(); ++s) CHECK(at::equal(rows[s], tokens[by_slot[s]]));
  }
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t j = 0; j < k; ++j) dropped += kept[t][j].item<bool>() ? 0 : 1;
  CHECK(dropped == r.dropped);
  if (drop_tokens) CHECK(dropped > 0);

  std::vector<at::Tensor> outputs;
  for (int64_t e = 0; e < kExperts; ++e) outputs.push_back(expert(d.expert_inputs()[e], e));
  const at::Tensor y = d.combine(outputs);

  // The same by a loop over tokens, from the same leaves.
  std::vector<at::Tensor> want_rows;
  for (int64_t t = 0; t < kTokens; ++t) {
    at::Tensor row = at::zeros({kHidden});
    for (int64_t j = 0; j < k; ++j)
      if (kept[t][j].item<bool>()) row = row + r.weight[t][j] * expert(tokens[t], expert_of[t][j].item<int64_t>());
    want_rows.push_back(row);
  }
  const at::Tensor want = at::stack(want_rows);
  CHECK(at::allclose(y, want, 1e-6, 1e-6));

  const at::Tensor g = at::randn({kTokens, kHidden});
  // Both share the router's graph: keep it for the second.
  const auto got_grads = torch::autograd::grad({(y * g).sum()}, {tokens, logits}, {}, /*retain_graph=*/true);
  const auto want_grads = torch::autograd::grad({(want * g).sum()}, {tokens, logits});
  CHECK(at::allclose(got_grads[0], want_grads[0], 1e-5, 1e-6));
  CHECK(at::allclose(got_grads[1], want_grads[1], 1e-5, 1e-6));

  // An expert that does not return one row per input row is refused by name.
  outputs[1] = outputs[1].narrow(0, 0, outputs[1].size(0) - 1);
  CHECK_THROWS_WITH(d.combine(outputs), Catch::Contains("local expert 1 got") &&
                                            Catch::Contains("an expert maps each row to one row"));
}

}  // namespace

TEST_CASE("MoE dispatch: each expert gets its kept tokens by slot and combine weights them back") {
  SECTION("top-1 with a capacity") { check_dispatch(1, true); }
  SECTION("top-2 with a capacity") { check_dispatch(2, true); }
  SECTION("top-1 dropless") { check_dispatch(1, false); }
  SECTION("top-2 dropless") { check_dispatch(2, false); }
}
