#include "parallel/tensor_parallel/layers.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>

#include <stdexcept>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  Communicator& tensor, const TensorParallelStyle& style, bool gather_output) {
  const at::Tensor input = style.sequence_parallel ? gather_from_sequence_region(x, tensor, style.seq_dim)
                                                   : copy_to_tensor_region(x, tensor);
  at::Tensor y = at::linear(input, weight, bias);
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

at::Tensor tensor_parallel_slice(const at::Tensor& whole, int64_t rank, int64_t ranks, int64_t dim, int64_t fused,
                                 const std::string& what) {
  if (dim < 0) dim += whole.dim();
  const int64_t size = whole.size(dim);
  if (fused < 1 || size % (fused * ranks) != 0)
    throw std::invalid_argument("tessera: tensor parallelism: " + what + " has " + std::to_string(size) +
                                " entries along dimension " + std::to_string(dim) +
                                (fused > 1 ? " (" + std::to_string(fused) + " fused blocks)" : std::string()) +
                                ", which does not divide evenly over tensor_parallel.tp_size = " +
                                std::to_string(ranks));
  const int64_t block = size / fused, piece = block / ranks;
  std::vector<at::Tensor> pieces;
  for (int64_t f = 0; f < fused; ++f) pieces.push_back(whole.narrow(dim, f * block + rank * piece, piece));
  return at::cat(pieces, dim).contiguous();
}

}  // namespace tessera
