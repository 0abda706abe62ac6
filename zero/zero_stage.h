// What differs between ZeRO stages 0, 1 and 2 (Rajbhandari et al. 2020), one strategy each:
//
//   stage 0 (zero/stage0.cpp)  whole fp32 gradients, allreduced bucket by bucket on the micro-step
//                              that ends an accumulation; every rank updates everything
//   stage 1 (zero/stage1.cpp)  whole fp32 gradients, reduce-scattered on that micro-step into this
//                              rank's chunks; the optimizer updates the chunks; allgather after
//   stage 2 (zero/stage2.cpp)  every micro-step: a bucket's gradients fill a staging buffer that is
//                              reduce-scattered and added into this rank's fp32 gradient shard;
//                              the full gradient never exists on a rank; allgather after
//   stage 3 (zero/stage2.cpp)  gradients as stage 2; the parameters are partitioned too: only
//                              groups of persistent (small) parameters gather after the step,
//                              the others per unit around its forward and backward
//                              (zero/partitioned_parameters.h)
//
// ZeroOptimizer (zero/zero_optimizer.h) does what is common: buffers, hooks, the fixed launch
// order, the optimizer on the shard. A strategy is called with the group and bucket to act on; it
// reduces and partitions over the group's own communicator (ZeroGroup::comm: the data group, or
// the one ParamGroup::communicator names), so groups over different ranks share one strategy.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

#include "parallel/communicator.h"
#include "zero/reductions.h"
#include "zero/zero_group.h"

namespace tessera {

class ZeroStage {
 public:
  // `wire`: the dtype gradients travel in (communication_data_type); fp32 accumulation either way.
  explicit ZeroStage(at::ScalarType wire) : wire_(wire) {}
  virtual ~ZeroStage() = default;

  virtual int number() const = 0;
  // DeepSpeed's gradient_predivide_factor f (prescale_gradients: f = the data-parallel size): a
  // bucket is divided by f before its reduction, summed, and multiplied by f/p after; 1 (the
  // default): averaged by the collective.
  void set_predivide_factor(double f) { predivide_ = f; }
  // The rank whose chunk of each of g's buckets this rank's optimizer updates (0 when nothing is
  // sharded): its rank in g's communicator.
  virtual int shard_rank(const ZeroGroup& g) const { return g.comm->rank(); }
  // Whether this rank's gradients are 1/N of the group's (the norm sums them over its communicator).
  virtual bool gradients_data_sharded() const { return true; }
  // Whether a micro-step inside an accumulation window reduces its gradients (stage 2) or only
  // the micro-step that ends the window does (stages 0 and 1).
  virtual bool reduces_every_micro_step() const { return false; }

  // Folds one parameter's gradient (flat) into the stage's accumulation buffer.
  virtual void accumulate(ZeroGroup& g, int param, const at::Tensor& flat_grad, Reductions& r) = 0;
  // A complete bucket: launch its reduction (or fold it locally on a single rank). `done` (may be
  // empty) runs once gradient_chunk(g, bucket) holds the result: the optimizer takes its norm then.
  virtual void reduce_bucket(ZeroGroup& g, int bucket, Reductions& r, std::function<void()> done) = 0;
  // This rank's reduced gradients of a bucket's chunk, as a view that stays valid.
  virtual at::Tensor gradient_chunk(ZeroGroup& g, int bucket) = 0;
  // Stages 2–3 with the optimizer on the host (gradients straight to the host): each bucket's
  // reduced chunk (this rank's average, on the device in the reduction's staging buffer) goes to
  // `to` instead of being added into the group's gradient shard, which is then not allocated.
  using ReducedChunk = std::function<void(ZeroGroup& g, int bucket, at::Tensor& reduced)>;
  void send_reduced_chunks(ReducedChunk to) { reduced_to_ = std::move(to); }
  // Whether g's updated chunks are gathered after the optimizer (stages 1–2 over 2+ ranks).
  virtual bool gathers(const ZeroGroup& g) const { return false; }
  // After the optimizer updated this rank's chunk of a bucket: every rank gets every chunk of it,
  // in place (called only when gathers(); an empty handle at stage 0).
  virtual CommHandle gather_bucket(ZeroGroup& g, int bucket) { return {}; }

 protected:
  // Stages 0 and 1 accumulate into the whole fp32 gradient buffer.
  static void add_to_whole_gradients(ZeroGroup& g, int param, const at::Tensor& flat_grad);
  // Launches the average over `over` of an fp32 `bucket` into `result`, a view of it (its
  // own chunk for a reduce-scatter, the whole bucket for an allreduce), in place; `then` runs once
  // the result is there. In a wire dtype other than fp32 the bucket travels as a copy in it (2
  // bytes an element for bf16/fp16: half the traffic) and the result is converted back.
  void reduce_async(Reductions& r, Communicator& over, const at::Tensor& bucket, const at::Tensor& result,
                    bool scatter, std::function<void()> then = {});

  at::ScalarType wire_;
  double predivide_ = 1.0;
  ReducedChunk reduced_to_;  // empty: into the gradient shard
};

// Stages 1–2: each rank updates its chunks, then the updated chunks are allgathered.
class PartitionedStage : public ZeroStage {
 public:
  PartitionedStage(at::ScalarType wire, bool reduce_scatter) : ZeroStage(wire), reduce_scatter_(reduce_scatter) {}
  bool gathers(const ZeroGroup& g) const override { return g.comm->size() > 1; }
  CommHandle gather_bucket(ZeroGroup& g, int bucket) override;

 protected:
  // The average of a whole bucket into this rank's chunk of it: a reduce-scatter, or with
  // reduce_scatter false an allreduce of the whole bucket (the chunk is then read from it).
  void reduce_into_own_chunk(Reductions& r, Communicator& over, const at::Tensor& bucket, const at::Tensor& own_chunk,
                             std::function<void()> then = {}) {
    reduce_async(r, over, bucket, reduce_scatter_ ? own_chunk : bucket, reduce_scatter_, std::move(then));
  }

 private:
  bool reduce_scatter_;
};

// `wire`: communication_data_type; `reduce_scatter` false: stages 1–2 allreduce each bucket (in
// place) and keep their chunk.
std::unique_ptr<ZeroStage> make_zero_stage(int stage, at::ScalarType wire = at::kFloat, bool reduce_scatter = true);

}  // namespace tessera
