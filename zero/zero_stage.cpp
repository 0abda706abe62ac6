#include "zero/zero_stage.h"

#include <stdexcept>
#include <string>

namespace tessera {

std::unique_ptr<ZeroStage> make_stage0(at::ScalarType wire);
std::unique_ptr<ZeroStage> make_stage1(at::ScalarType wire, bool reduce_scatter);
std::unique_ptr<ZeroStage> make_stage2(at::ScalarType wire, bool reduce_scatter);
std::unique_ptr<ZeroStage> make_stage3(at::ScalarType wire, bool reduce_scatter);

std::unique_ptr<ZeroStage> make_zero_stage(int stage, at::ScalarType wire, bool reduce_scatter) {
  switch (stage) {
    case 0: return make_stage0(wire);
    case 1: return make_stage1(wire, reduce_scatter);
    case 2: return make_stage2(wire, reduce_scatter);
    case 3: return make_stage3(wire, reduce_scatter);
  }
  throw std::invalid_argument("tessera: zero_optimization.stage " + std::to_string(stage) + " does not exist (0, 1, 2, 3)");
}

void ZeroStage::add_to_whole_gradients(ZeroGroup& g, int param, const at::Tensor& flat_grad) {
  const FlatParam& p = g.layout.params[param];
  g.grads.narrow(0, p.offset, p.numel).add_(flat_grad);
}

void ZeroStage::reduce_async(Reductions& r, Communicator& over, const at::Tensor& bucket, const at::Tensor& result,
                             bool scatter, std::function<void()> then) {
  r.make_room();
  const bool predivide = predivide_ != 1.0;
  const ReduceOp op = predivide ? ReduceOp::Sum : ReduceOp::Avg;
  if (predivide) {
    // The bucket is this stage's own buffer (fp32): divided in place, the rest after the sum.
    bucket.div_(predivide_);
    then = [result, factor = predivide_ / over.size(), then = std::move(then)]() mutable {
      at::Tensor out = result;
      out.mul_(factor);
      if (then) then();
    };
  }
  if (wire_ == bucket.scalar_type()) {
    at::Tensor inout = scatter ? result : bucket;
    r.push(scatter ? over.reduce_scatter_async(bucket, inout, op) : over.all_reduce_async(inout, op), std::move(then));
    return;
  }
  // The bucket in the wire dtype; the result's place in it, by its offset in the bucket.
  at::Tensor wire = bucket.to(wire_);
  const int64_t offset = (static_cast<const char*>(result.data_ptr()) - static_cast<const char*>(bucket.data_ptr())) /
                         static_cast<int64_t>(bucket.element_size());
  at::Tensor wire_result = wire.narrow(0, offset, result.numel());
  CommHandle h = scatter ? over.reduce_scatter_async(wire, wire_result, op) : over.all_reduce_async(wire, op);
  r.push(std::move(h), [result, wire, wire_result, then = std::move(then)]() mutable {
    at::Tensor out = result;
    out.copy_(wire_result);
    if (then) then();
  });
}

CommHandle PartitionedStage::gather_bucket(ZeroGroup& g, int bucket) {
  const FlatBucket& k = g.layout.buckets[bucket];
  // In place: the input is this rank's chunk of the output (parallel/communicator.h).
  at::Tensor chunk = g.compute.narrow(0, g.layout.flat_of_local(g.comm->rank(), bucket), k.shard);
  at::Tensor whole = g.compute.narrow(0, k.offset, k.numel);
  return g.comm->all_gather_async(chunk, whole);
}

}  // namespace tessera
