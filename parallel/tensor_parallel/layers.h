// Megatron-LM's tensor-parallel layers as functions of this rank's weight slices, for models written
// with ATen ops (examples/models/gpt.cpp); tessera.tensor_parallel wraps the same functions for
// torch.nn modules. Each function costs the collectives of its region crossings
// (parallel/tensor_parallel/regions.h) and nothing else.
//
// A linear layer Y = X·Aᵀ + b with A [out, in] (Shoeybi et al. 2019, §3):
//   column-parallel   this rank holds rows out/t of A (and of b): Y's features are split, no
//                     collective forward; the input crosses f (or, with sequence parallelism, is
//                     all-gathered along the sequence; only this rank's part is kept for backward,
//                     which gathers it again, as Megatron does).
//   row-parallel      this rank holds columns in/t of A and takes X split along its features; the
//                     partial products are summed by g (or reduce-scattered along the sequence), then
//                     the whole bias (replicated) is added once (under sequence parallelism each rank
//                     adds it to its part of the sequence, and its gradient is summed over the group).
// The embedding splits the vocabulary: rank r holds rows [r·V/t, (r+1)·V/t) and looks up only the
// ids it holds (zeros elsewhere), then g sums the pieces. Sequence parallelism keeps activations
// outside these layers split along `seq_dim` ([batch, seq, features]: 1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace tessera {

class Communicator;

struct TensorParallelStyle {
  bool sequence_parallel = false;  // activations between the layers split along seq_dim (Megatron-SP)
  int64_t seq_dim = 1;
};

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  Communicator& tensor, const TensorParallelStyle& style = {},
                                  bool gather_output = false);
at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               Communicator& tensor, const TensorParallelStyle& style = {});
// `vocab_start`: the first id of this rank's rows (rank · weight.size(0) where every rank holds as
// many).
at::Tensor vocab_parallel_embedding(const at::Tensor& ids, const at::Tensor& weight, int64_t vocab_start,
                                    Communicator& tensor, const TensorParallelStyle& style = {});

// tensor_parallel_slice (a whole tensor cut to this rank's part) is in regions.h.

}  // namespace tessera
