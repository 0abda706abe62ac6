// ZeroOptimizer: the flat buffers of every parameter group and what happens to gradients and
// parameters in one step, for ZeRO stages 0, 1 and 2 (Rajbhandari et al. 2020).
//
// What each rank keeps (Ψ parameters, N data-parallel ranks, fp32 Adam; see docs/zero.md):
//   stage 0  params 4Ψ, fp32 grads 4Ψ, Adam m+v 8Ψ                         = 16Ψ
//   stage 1  params 4Ψ, fp32 grads 4Ψ, Adam m+v 8Ψ/N                       = 8Ψ + 8Ψ/N
//   stage 2  params 4Ψ, fp32 grads 4Ψ/N, Adam m+v 8Ψ/N                     = 4Ψ + 12Ψ/N
// With bf16/fp16 compute, params are 2Ψ and an fp32 master shard (4Ψ/N at stages 1–2, 4Ψ at 0)
// is added; gradients are still accumulated in fp32.
//
// Gradients: each parameter's gradient is folded, as soon as autograd has produced it (a
// post-accumulate-grad hook), into the fp32 buffers and released. When every parameter of a
// bucket has arrived, the bucket is reduced asynchronously while backward goes on:
//   stage 0  allreduce of the bucket (only on the micro-step that ends an accumulation)
//   stage 1  reduce-scatter of the bucket into this rank's chunk (same micro-step only)
//   stage 2  reduce-scatter of the bucket, every micro-step, from a staging buffer into the
//            rank's fp32 gradient shard; the full gradient never exists on a rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "optim/flat_optimizer.h"
#include "parallel/communicator.h"
#include "zero/flat_layout.h"

namespace tessera {

class ParallelContext;

class ZeroOptimizer {
 public:
  ZeroOptimizer(const Config& config, ParallelContext& parallel, ModelDescription& model);
  ~ZeroOptimizer();

  // Whether the coming backward ends a gradient accumulation (stages 0/1 communicate only then).
  void begin_backward(bool boundary);
  // After autograd: launch the buckets still waiting (parameters with no gradient count as zero),
  // in the fixed order, and wait for every reduction. With ignore_unused_parameters false, a
  // parameter without a gradient is an error naming it.
  void end_backward();
  // After autograd threw (a caught KeyboardInterrupt, out of memory): waits for the reductions
  // already launched, resets the bucket counters and discards the gradients accumulated since the
  // last optimizer step (they mix the interrupted micro-step in), so the next backward starts clean.
  void abort_backward();

  // Waits for every reduction; the sum of squares of all gradients (still loss-scaled) over the
  // data-parallel group: non-finite when any rank's gradients overflowed.
  double global_grad_sumsq();
  // The optimizer on this rank's shard with the gradients multiplied by `grad_scale` (1/loss scale
  // × the clipping coefficient), then the allgather of the updated parameters (stages 1–2).
  void apply(double grad_scale, const StepInputs& inputs);
  void zero_grad();
  MemoryReport memory() const;

  // Called by the gradient hooks.
  void on_grad_ready(int group, int param, const at::Tensor& grad);

 private:
  struct Group;
  struct InFlight {
    CommHandle handle;
    std::function<void()> finish;
  };
  bool communicates() const { return stage_ == 2 || boundary_; }  // this micro-step reduces gradients
  void launch_ready_buckets();
  void launch_bucket(Group& g, int bucket);
  void reset_bucket_counters();
  std::string unused_parameters() const;
  at::Tensor acquire_staging(int64_t numel);
  void release_staging(const at::Tensor& staging);
  at::Tensor receive_buffer(int64_t numel);
  void wait_oldest();
  void wait_all();
  std::vector<ShardSegment> make_segments(const Group& g) const;
  void fill_from_model(Group& g, const ParamGroup& spec, int rank);
  void allgather_parameters(Group& g);

  int stage_;
  int64_t bucket_numel_, allgather_numel_;
  Communicator& data_;
  at::ScalarType compute_dtype_;
  std::vector<std::unique_ptr<Group>> groups_;
  bool ignore_unused_parameters_;
  bool boundary_ = true;
  // Buckets are reduced in one fixed order on every rank (group by group, bucket by bucket, which
  // is the order backward fills them): a bucket waits for the ones before it, so a parameter that
  // one rank skips cannot reorder the collectives across ranks.
  std::vector<std::pair<int, int>> launch_order_;  // (group, bucket)
  size_t next_launch_ = 0;
  std::deque<InFlight> in_flight_;
  std::vector<at::Tensor> staging_free_;
  int64_t staging_bytes_ = 0;                          // staging buffers allocated (stage 2)
  int64_t receive_bytes_now_ = 0, receive_bytes_peak_ = 0;  // reduce-scatter receive chunks in flight
};

}  // namespace tessera
