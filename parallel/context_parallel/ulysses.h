// Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses"): attention over a sequence split across the
// context group by two all-to-alls. Each of q, k, v arrives sequence-split with every head; one
// all-to-all makes it whole-sequence with heads/N heads (sequence_to_heads), any attention runs
// locally over the whole sequence for those heads, and the reverse all-to-all brings the output
// back sequence-split with every head (heads_to_sequence). Each is an autograd function whose
// backward is the other. A rank sends (N−1)/N of its q, k, v and output each way.
//
// The heads must divide by the group size (after tensor parallelism has split them): otherwise an
// invalid_argument says so and names ring attention (ring_attention.h), which takes any head count.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

class Communicator;

// [.., S/N (seq_dim), .., H (head_dim), ..] -> [.., S, .., H/N, ..]: this rank's heads over the whole
// sequence, rank i's tokens at [i·S/N, (i+1)·S/N) (the contiguous layout).
at::Tensor sequence_to_heads(const at::Tensor& x, Communicator& context, int64_t seq_dim, int64_t head_dim);
// The inverse: [.., S, .., H/N, ..] -> [.., S/N, .., H, ..].
at::Tensor heads_to_sequence(const at::Tensor& x, Communicator& context, int64_t seq_dim, int64_t head_dim);

// Throws the error above when `heads` does not divide over `ranks`.
void check_ulysses_heads(int64_t heads, int64_t ranks);

}  // namespace tessera
