// Where each token of a sequence lives under context parallelism, and the loss over the whole
// sequence. The context group's N ranks see the same samples; each holds a part of every sequence:
//
//   contiguous (Ulysses)   rank r holds tokens [r·L/N, (r+1)·L/N)
//   balanced (ring)        the sequence cut into 2N chunks, rank r holds chunks r and 2N−1−r, so that
//                          under a causal mask every rank attends to as many key/value pairs as any
//                          other (Brandon et al. 2023, "Striped Attention"; Megatron-Core's and
//                          torchtitan's load-balanced context parallelism use the same chunks)
//
// Positions stay the global ones (context_positions), and the loss is the mean over every token of
// the global sequence (context_mean), not a mean of the ranks' means.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace tessera {

class Communicator;

// The chunks of the sequence a rank holds: `balanced` for ring attention, contiguous for Ulysses.
struct ContextLayout {
  int64_t ranks = 1;
  int64_t rank = 0;
  bool balanced = false;
  int64_t chunks() const { return balanced ? 2 * ranks : ranks; }  // the sequence is cut into these
};

// The layout a method uses: "ring" balanced, "ulysses" contiguous (anything else: invalid_argument).
ContextLayout context_layout(const std::string& method, int64_t ranks, int64_t rank);

// This rank's part of `x` along `dim` (a copy). A length that `chunks()` does not divide is an
// invalid_argument naming the length, the size and the padding helper.
at::Tensor context_shard(const at::Tensor& x, int64_t dim, const ContextLayout& layout);
// The global positions of this rank's tokens of a sequence of `length` (int64, on `device`).
at::Tensor context_positions(int64_t length, const ContextLayout& layout, c10::Device device = c10::kCPU);
// The inverse of context_shard, a collective over the context group (outside autograd): the whole
// sequence on every rank, for evaluation and tests.
at::Tensor context_unshard(const at::Tensor& part, Communicator& context, int64_t dim, const ContextLayout& layout);
// How many positions to append so that `length` divides into the layout's chunks.
int64_t context_padding(int64_t length, const ContextLayout& layout);

// The mean over the whole sequence of a loss summed over this rank's tokens: Σ sums / Σ counts over
// the context group, the same value on every rank. Its gradient is context-size / Σ counts per unit
// of `local_sum`, so that the engine's average over data × context (every rank's gradient is a
// part of the sum) gives the gradient of the global mean. `local_count`: the tokens counted here (a
// scalar; ignored positions excluded).
at::Tensor context_mean(const at::Tensor& local_sum, const at::Tensor& local_count, Communicator& context);

}  // namespace tessera
