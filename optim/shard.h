// The pieces of a rank's flat shard that optimizers work on. zero/ lays the shards out
// (zero/flat_layout.h); optim/ only sees these views and offsets, never the layout itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera {

// One contiguous run of this rank's shard: fp32 master parameters and fp32 gradients (views), and
// where the run starts in the shard (the optimizer's states are laid out like the shard). Every
// optimizer writes the updated parameters into `compute_copy` when it is defined (Adam on the CPU
// fuses that write into its single pass over memory: csrc/cpu_adam.h).
struct ShardSegment {
  at::Tensor params;
  at::Tensor grads;
  int64_t local_offset = 0;
  at::Tensor compute_copy;  // mixed precision: the bf16/fp16 chunk to receive the updated params
};

// After an optimizer updated s.params: the compute copy takes them (mixed precision).
inline void write_compute_copy(const ShardSegment& s) {
  if (s.compute_copy.defined()) s.compute_copy.copy_(s.params);
}

// A piece of one parameter inside a rank's local shard (what LAMB needs for per-parameter norms).
struct ShardPiece {
  int param = 0;
  int64_t local_offset = 0;  // in the rank's local shard
  int64_t param_offset = 0;  // element offset inside the parameter
  int64_t numel = 0;
};

}  // namespace tessera
