// A stage's backward in two parts, as the zero-bubble schedules run it (Qi et al. 2023, "Zero
// Bubble Pipeline Parallelism", §2): B, the gradient of the stage's input, which the previous stage
// waits for, and W, the gradients of the stage's weights, which nothing downstream waits for and a
// schedule may defer into its idle time.
//
// Both parts are autograd's own passes over the graph the forward recorded, so a C++ stage model
// and a Python module split alike, with no change to either:
//   B runs autograd from the outputs to the input only (the weights' branches are not computed: a
//     matmul's node skips its weight-gradient product). At each node where a weight's branch leaves
//     the input's path (a linear layer's matmul, a LayerNorm), a hook keeps the gradient that
//     reached the node.
//   W runs autograd from each such node, seeded with the kept gradient, to that node's weights only:
//     the weight-gradient products B skipped, accumulated into the weights' .grad as a whole
//     backward would (hooks on the weights fire here: a ZeRO reduction starts in W).
// B keeps the graph (its saved tensors) until W. A weight reached from two such nodes (one tensor
// used twice on the stage's path) cannot be split this way: the whole backward then runs in W, and
// B only computes the input's gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace tessera::pipeline {

class SplitBackward {
 public:
  // B: back-propagates `grads` through `outputs` to `input` (a leaf that requires grad) and returns
  // the input's gradient; the weights' gradients wait for weights().
  SplitBackward(std::vector<at::Tensor> outputs, std::vector<at::Tensor> grads, const at::Tensor& input);
  ~SplitBackward();
  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;

  const at::Tensor& input_gradient() const { return input_gradient_; }
  // W: the weights' gradients, accumulated into their .grad. Once; frees the graph.
  void weights();
  // Whether B could leave the weights to W (false: weights() runs the whole backward again).
  bool split() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  at::Tensor input_gradient_;
};

}  // namespace tessera::pipeline
