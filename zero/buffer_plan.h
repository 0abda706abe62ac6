// The one place that decides the engine's flat buffers: a pure function (no tensors) from the
// parameter groups' sizes, the data-parallel degree, the ZeRO stage and the dtypes to every buffer
// and its size. ZeroOptimizer allocates exactly what it returns; the memory estimator
// (engine/estimator/) calls it for its model-state figures, so the two cannot drift apart.
//
// Per rank, Ψ parameters, N data-parallel ranks, k optimizer-state floats per element (docs/zero.md):
//   stage 0  compute Ψ, fp32 gradients Ψ,   states kΨ        (+ fp32 master Ψ when mixed)
//   stage 1  compute Ψ, fp32 gradients Ψ,   states kΨ/N      (+ fp32 master Ψ/N)
//   stage 2  compute Ψ, fp32 gradients Ψ/N, states kΨ/N      (+ fp32 master Ψ/N)
//   stage 3  compute Ψ/N, fp32 gradients Ψ/N, states kΨ/N    (+ fp32 master Ψ/N)
//            (groups of persistent parameters, below stage3_param_persistence_threshold, keep
//            their compute buffer whole as at stage 2; the units' gathered parameters come and go
//            with the forward and backward, bounded by stage3_max_live_parameters: not planned)
// (gradients in bf16 at stages 0–1 with data_types.grad_accum_dtype "bf16": 2 bytes an element)
// plus padding: every bucket is a multiple of the partition count (zero/flat_layout.h).
// Communication buffers (reduce-scatters and allgathers run in place, so only these):
//   stage 0     none
//   stages 1–2  with Gloo, its copy of each reduce-scatter's input in flight, at most 2
//               (zero/reductions.h): 2 × the largest bucket, fp32 (NCCL reduces in place)
//   all stages  with communication_data_type bf16/fp16, each reduction in flight (at most 2)
//               travels as a copy of its bucket in that dtype (and Gloo's copy is in it too)
//   stages 2–3  also, per group, two fp32 staging buffers of its largest bucket (one when it has
//               one bucket): a bucket fills while the one before it is reduced. The engine
//               measures its staging; it allocates more only if more of a group's buckets fill
//               at once.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/flat_layout.h"
#include "zero/options.h"

namespace tessera {

struct BufferPlanInput {
  std::vector<std::vector<int64_t>> group_numels;  // per parameter group, in registration order
  int stage = 0;              // ZeRO stage 0, 1, 2 or 3
  int data_parallel = 1;      // N
  int compute_bytes = 4;      // bytes per element of the model's parameters (2 for bf16/fp16)
  int64_t bucket_numel = ZeroSizeParams{}.reduce_bucket_size;
  int64_t state_floats = 2;   // fp32 optimizer-state elements per shard element (Adam 2)
  bool backend_copies_reductions = false;  // Gloo copies a reduce-scatter's input; NCCL does not
  int wire_bytes = 4;      // communication_data_type: below 4, each reduction in flight has a copy of its bucket in it
  int gradient_bytes = 4;  // data_types.grad_accum_dtype at stages 0–1: 2 for bf16
  // Stage 3, optional, per group: whether its parameters are partitioned (default: all are), and
  // per parameter the unit that owns it (buckets never mix units: zero/flat_layout.h).
  std::vector<bool> group_partitioned;
  std::vector<std::vector<int>> group_keys;
  // Optional, per group: the ranks it is partitioned over when that is not data_parallel (a group
  // on a communicator of its own, ParamGroup::communicator).
  std::vector<int> group_partitions;
};

struct GroupBuffers {
  FlatLayout layout;
  bool partitioned = false;   // stage 3: the compute buffer is this rank's shard
  int64_t compute_numel = 0;  // the model's parameters (compute dtype): whole, or the shard
  int64_t master_numel = 0;   // fp32 master shard (mixed precision), 0 otherwise
  int64_t grad_numel = 0;     // fp32 gradient accumulation: whole (stages 0–1) or the shard (2–3)
  int64_t largest_bucket = 0; // elements
  int staging_buffers = 0;    // stages 2–3: fp32 staging buffers of largest_bucket elements
  int64_t state_numel = 0;    // fp32 optimizer states of the shard
};

struct BufferPlan {
  int partitions = 1;  // 1 at stage 0, N at stages 1–3 (a group on its own communicator: its layout's)
  std::vector<GroupBuffers> groups;
  int64_t largest_bucket = 0;  // elements, over all groups
  // Bytes per rank.
  int64_t parameter_bytes = 0, master_bytes = 0, gradient_bytes = 0, state_bytes = 0;
  int64_t communication_bytes = 0;  // staging buffers (stages 2–3) + reductions in flight (1–3)
  int64_t in_flight_bytes = 0;      // the backend's copies of the reductions in flight (1–3)
  int staging_buffers = 0;          // stages 2–3, over all groups
};

BufferPlan plan_buffers(const BufferPlanInput& in);

}  // namespace tessera
