// Cross-entropy from logits split along the vocabulary, without any rank holding the whole logits
// (Megatron-LM's vocab-parallel cross-entropy). Rank r holds logits[..., r·V/t : (r+1)·V/t]:
//
//   loss_i = log Σ_v exp(z_iv − m_i) − (z_{i,y_i} − m_i),   m_i = max_v z_iv
//
// m_i is one all-reduce (max) of each rank's row maxima (a constant for autograd); Σ exp and the
// target's logit are each a local partial sum completed by g (all-reduce forward, identity
// backward: the gradient of a sum with respect to each rank's part is the sum's gradient). So the
// backward needs no collective and each rank's logits get softmax − one-hot on its own columns.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

class Communicator;

// logits: [..., V/t] (any float dtype; computed in fp32), targets: int64 [...] of global ids.
// Returns the mean over positions whose target is not `ignore_index` (F.cross_entropy's default),
// an fp32 scalar, the same on every tensor rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tensor,
                                        int64_t ignore_index = -100);

}  // namespace tessera
