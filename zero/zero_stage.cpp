#include "zero/zero_stage.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

std::unique_ptr<ZeroStage> make_stage0(Communicator& data);
std::unique_ptr<ZeroStage> make_stage1(Communicator& data, int64_t allgather_numel);
std::unique_ptr<ZeroStage> make_stage2(Communicator& data, int64_t allgather_numel);

std::unique_ptr<ZeroStage> make_zero_stage(int stage, Communicator& data, int64_t allgather_numel) {
  switch (stage) {
    case 0: return make_stage0(data);
    case 1: return make_stage1(data, allgather_numel);
    case 2: return make_stage2(data, allgather_numel);
  }
  throw std::invalid_argument("tessera: zero_optimization.stage " + std::to_string(stage) +
                              " is not implemented yet (stages 0, 1, 2 are)");
}

void ZeroStage::add_to_whole_gradients(ZeroGroup& g, int param, const at::Tensor& flat_grad) {
  const FlatParam& p = g.layout.params[param];
  g.grads.narrow(0, p.offset, p.numel).add_(flat_grad);
}

void PartitionedStage::gather_parameters(ZeroGroup& g) {
  if (data_.size() == 1) return;
  const int rank = data_.rank();
  std::vector<std::pair<CommHandle, at::Tensor>> pending;  // the handle and its input, kept alive
  int64_t in_flight = 0;
  for (size_t b = 0; b < g.layout.buckets.size(); ++b) {
    const FlatBucket& k = g.layout.buckets[b];
    // In place: the input is this rank's chunk of the output (parallel/communicator.h).
    at::Tensor chunk = g.compute.narrow(0, g.layout.flat_of_local(rank, b), k.shard);
    at::Tensor whole = g.compute.narrow(0, k.offset, k.numel);
    pending.emplace_back(data_.all_gather_async(chunk, whole), chunk);
    in_flight += k.numel;
    if (in_flight >= allgather_numel_) {  // at most allgather_bucket_size elements in flight
      for (auto& p : pending) p.first.wait();
      pending.clear();
      in_flight = 0;
    }
  }
  for (auto& p : pending) p.first.wait();
}

}  // namespace tessera
