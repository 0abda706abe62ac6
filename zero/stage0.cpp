// ZeRO stage 0: plain data parallelism over flat buffers (zero/zero_stage.h).
#include "zero/zero_stage.h"

namespace tessera {

class Stage0 final : public ZeroStage {
 public:
  using ZeroStage::ZeroStage;
  int number() const override { return 0; }
  int shard_rank(const ZeroGroup&) const override { return 0; }
  bool gradients_data_sharded() const override { return false; }

  void accumulate(ZeroGroup& g, int param, const at::Tensor& flat, Reductions&) override {
    add_to_whole_gradients(g, param, flat);
  }
  void reduce_bucket(ZeroGroup& g, int bucket, Reductions& r, std::function<void()> done) override {
    if (g.comm->size() == 1) {
      if (done) done();
      return;
    }
    const FlatBucket& b = g.layout.buckets[bucket];
    at::Tensor view = g.grads.narrow(0, b.offset, b.numel);
    reduce_async(r, *g.comm, view, view, /*scatter=*/false, std::move(done));
  }
  at::Tensor gradient_chunk(ZeroGroup& g, int bucket) override {
    const FlatBucket& b = g.layout.buckets[bucket];
    return g.grads.narrow(0, b.offset, b.numel);  // one partition: the chunk is the bucket
  }
};

std::unique_ptr<ZeroStage> make_stage0(at::ScalarType wire) {
  return std::make_unique<Stage0>(wire);
}

}  // namespace tessera
