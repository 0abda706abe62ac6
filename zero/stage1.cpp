// ZeRO stage 1: optimizer states partitioned (zero/zero_stage.h).
#include "zero/zero_stage.h"

namespace tessera {

class Stage1 final : public PartitionedStage {
 public:
  using PartitionedStage::PartitionedStage;
  int number() const override { return 1; }

  void accumulate(ZeroGroup& g, int param, const at::Tensor& flat, Reductions&) override {
    add_to_whole_gradients(g, param, flat);
  }
  // Reduce-scatter the whole bucket in place: this rank's chunk of it becomes the average (the
  // other chunks are left unspecified; the step reads only this rank's).
  void reduce_bucket(ZeroGroup& g, int bucket, Reductions& r, std::function<void()> done) override {
    if (g.comm->size() == 1) {
      if (done) done();
      return;
    }
    const FlatBucket& b = g.layout.buckets[bucket];
    at::Tensor mine = gradient_chunk(g, bucket);
    reduce_into_own_chunk(r, *g.comm, g.grads.narrow(0, b.offset, b.numel), mine, std::move(done));
  }
  at::Tensor gradient_chunk(ZeroGroup& g, int bucket) override {
    return g.grads.narrow(0, g.layout.flat_of_local(g.comm->rank(), bucket), g.layout.buckets[bucket].shard);
  }
};

std::unique_ptr<ZeroStage> make_stage1(at::ScalarType wire, bool reduce_scatter) {
  return std::make_unique<Stage1>(wire, reduce_scatter);
}

}  // namespace tessera
