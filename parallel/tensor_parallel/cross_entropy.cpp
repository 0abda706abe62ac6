#include "parallel/tensor_parallel/cross_entropy.h"

#include <ATen/ops/cross_entropy_loss.h>

#include <stdexcept>

#include "parallel/communicator.h"
#include "parallel/tensor_parallel/regions.h"

namespace tessera {

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tensor,
                                        int64_t ignore_index) {
  const int64_t vocab_local = logits.size(-1);
  const at::Tensor z_all = logits.to(at::kFloat).reshape({-1, vocab_local});
  const at::Tensor y = targets.to(logits.device(), at::kLong).reshape({-1});
  if (y.numel() != z_all.size(0))
    throw std::invalid_argument("tessera: vocab_parallel_cross_entropy: " + std::to_string(y.numel()) +
                                " targets for " + std::to_string(z_all.size(0)) + " rows of logits");
  if (tensor.size() == 1) return at::cross_entropy_loss(z_all, y, {}, at::Reduction::Mean, ignore_index);

  at::Tensor row_max = std::get<0>(z_all.detach().max(-1, /*keepdim=*/true)).contiguous();
  tensor.all_reduce(row_max, ReduceOp::Max);
  const at::Tensor z = z_all.sub(row_max);
  const at::Tensor sum_exp = reduce_from_tensor_region(z.exp().sum(-1), tensor);

  const int64_t start = tensor.rank() * vocab_local;
  const at::Tensor mine = y.ge(start).logical_and_(y.lt(start + vocab_local));
  const at::Tensor column = y.sub(start).masked_fill_(mine.logical_not(), 0).unsqueeze(-1);
  const at::Tensor target_z = reduce_from_tensor_region(z.gather(-1, column).squeeze(-1).masked_fill(mine.logical_not(), 0), tensor);

  const at::Tensor counted = y.ne(ignore_index);
  const at::Tensor losses = sum_exp.log().sub(target_z).masked_fill(counted.logical_not(), 0);
  return losses.sum().div(counted.sum().clamp_min(1).to(at::kFloat));
}

}  // namespace tessera
