#include "parallel/tensor_parallel/layers.h"

#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>

#include <stdexcept>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

namespace {

// Under sequence parallelism a column-parallel layer reads the whole sequence, but keeps only this
// rank's part of it for backward and all-gathers it again there (Korthikanti et al. 2022, §4.2.2;
// Megatron's linear with sequence parallelism): autograd through a plain all-gather + linear would
// keep the gathered input, t times the bytes.
struct SequenceParallelColumnLinear : torch::autograd::Function<SequenceParallelColumnLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, int64_t comm, int64_t seq_dim) {
    Communicator& tensor = communicator_of(comm);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["seq_dim"] = seq_dim;
    ctx->saved_data["bias"] = bias.defined();
    return at::linear(all_gather_along(x, tensor, seq_dim), weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    Communicator& tensor = communicator_of(ctx->saved_data["comm"].toInt());
    const int64_t seq_dim = ctx->saved_data["seq_dim"].toInt();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = reduce_scatter_along(at::matmul(g, weight), tensor, seq_dim);
    if (ctx->needs_input_grad(1)) {
      const at::Tensor whole = all_gather_along(x, tensor, seq_dim);  // gathered again, not kept
      grad_w = at::mm(g.reshape({-1, g.size(-1)}).t(), whole.reshape({-1, whole.size(-1)}));
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_b = g.reshape({-1, g.size(-1)}).sum(0);
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  Communicator& tensor, const TensorParallelStyle& style, bool gather_output) {
  at::Tensor y;
  if (style.sequence_parallel && tensor.size() > 1) {
    y = SequenceParallelColumnLinear::apply(x, weight, bias,
                                            communicator_handle(tensor), style.seq_dim);
  } else {
    y = at::linear(copy_to_tensor_region(x, tensor), weight, bias);
  }
  return gather_output ? gather_from_tensor_region(y, tensor, -1) : y;
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               Communicator& tensor, const TensorParallelStyle& style) {
  at::Tensor partial = at::linear(x, weight);
  if (!style.sequence_parallel) {
    at::Tensor y = reduce_from_tensor_region(partial, tensor);
    return bias.defined() ? y.add(bias) : y;
  }
  // The bias meets this rank's part of the sequence only: its gradient is summed over the group
  // (f on the bias), so the replicated copies stay equal.
  at::Tensor y = reduce_scatter_to_sequence_region(partial, tensor, style.seq_dim);
  return bias.defined() ? y.add(copy_to_tensor_region(bias, tensor)) : y;
}

at::Tensor vocab_parallel_embedding(const at::Tensor& ids, const at::Tensor& weight, int64_t vocab_start,
                                    Communicator& tensor, const TensorParallelStyle& style) {
  if (tensor.size() == 1) return at::embedding(weight, ids);
  // Ids outside this rank's rows look up row 0 and are zeroed: their gradient is zero too.
  const at::Tensor outside = ids.lt(vocab_start).logical_or_(ids.ge(vocab_start + weight.size(0)));
  const at::Tensor local = ids.sub(vocab_start).masked_fill_(outside, 0);
  const at::Tensor partial = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
  return style.sequence_parallel ? reduce_scatter_to_sequence_region(partial, tensor, style.seq_dim)
                                 : reduce_from_tensor_region(partial, tensor);
}

}  // namespace tessera
