#include "zero/zero_stage.h"

#include <stdexcept>
#include <string>

namespace tessera {

std::unique_ptr<ZeroStage> make_stage0(Communicator& data);
std::unique_ptr<ZeroStage> make_stage1(Communicator& data, bool reduce_scatter);
std::unique_ptr<ZeroStage> make_stage2(Communicator& data, bool reduce_scatter);

std::unique_ptr<ZeroStage> make_zero_stage(int stage, Communicator& data, bool reduce_scatter) {
  switch (stage) {
    case 0: return make_stage0(data);
    case 1: return make_stage1(data, reduce_scatter);
    case 2: return make_stage2(data, reduce_scatter);
  }
  throw std::invalid_argument("tessera: zero_optimization.stage " + std::to_string(stage) +
                              " is not implemented yet (stages 0, 1, 2 are)");
}

void ZeroStage::add_to_whole_gradients(ZeroGroup& g, int param, const at::Tensor& flat_grad) {
  const FlatParam& p = g.layout.params[param];
  g.grads.narrow(0, p.offset, p.numel).add_(flat_grad);
}

CommHandle PartitionedStage::reduce_into_own_chunk(const at::Tensor& bucket, at::Tensor& own_chunk) {
  if (reduce_scatter_) return data_.reduce_scatter_async(bucket, own_chunk, ReduceOp::Avg);
  at::Tensor whole = bucket;
  return data_.all_reduce_async(whole, ReduceOp::Avg);
}

CommHandle PartitionedStage::gather_bucket(ZeroGroup& g, int bucket) {
  if (data_.size() == 1) return {};
  const FlatBucket& k = g.layout.buckets[bucket];
  // In place: the input is this rank's chunk of the output (parallel/communicator.h).
  at::Tensor chunk = g.compute.narrow(0, g.layout.flat_of_local(data_.rank(), bucket), k.shard);
  at::Tensor whole = g.compute.narrow(0, k.offset, k.numel);
  return data_.all_gather_async(chunk, whole);
}

}  // namespace tessera
