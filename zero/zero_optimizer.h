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

struct ZeroStepResult {
  bool overflow = false;
  double grad_norm = 0;  // global, unscaled, before clipping
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(const Config& config, ParallelContext& parallel, ModelDescription& model);
  ~ZeroOptimizer();

  // Whether the coming backward ends a gradient accumulation (stages 0/1 communicate only then).
  void begin_backward(bool boundary);
  // After autograd: launch the buckets still waiting (unused parameters) and wait for every reduction.
  void end_backward();

  // The optimizer step on this rank's shard, then the allgather of the updated parameters.
  // `loss_scale` divides the gradients; `clip` is gradient_clipping (0: none).
  ZeroStepResult step(double loss_scale, double clip, const StepInputs& inputs);
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
  void launch_bucket(Group& g, int bucket);
  at::Tensor acquire_staging(int64_t numel);
  at::Tensor receive_buffer(int64_t numel);
  void wait_oldest();
  void wait_all();
  std::vector<ShardSegment> make_segments(const Group& g) const;
  double local_grad_sumsq(Group& g);
  void allgather_parameters(Group& g);

  int stage_;
  int64_t bucket_numel_, allgather_numel_;
  Communicator& data_;
  at::ScalarType compute_dtype_;
  std::vector<std::unique_ptr<Group>> groups_;
  bool boundary_ = true;
  std::deque<InFlight> in_flight_;
  std::vector<at::Tensor> staging_free_;
  int64_t staging_bytes_ = 0;                          // staging buffers allocated (stage 2)
  int64_t receive_bytes_now_ = 0, receive_bytes_peak_ = 0;  // reduce-scatter receive chunks in flight
};

}  // namespace tessera
