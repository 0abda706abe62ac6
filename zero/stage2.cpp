// ZeRO stage 2: optimizer states and gradients partitioned (zero/zero_stage.h). Stage 3 reduces its
// gradients the same way; its parameters' gathers are zero/partitioned_parameters.h's.
#include "zero/zero_stage.h"

namespace tessera {

class Stage2 final : public PartitionedStage {
 public:
  Stage2(int number, at::ScalarType wire, bool reduce_scatter) : PartitionedStage(wire, reduce_scatter), number_(number) {}
  int number() const override { return number_; }
  bool reduces_every_micro_step() const override { return true; }

  // A bucket's gradients gather in a staging buffer while the bucket fills.
  void accumulate(ZeroGroup& g, int param, const at::Tensor& flat, Reductions& r) override {
    const FlatParam& p = g.layout.params[param];
    const FlatBucket& b = g.layout.buckets[p.bucket];
    at::Tensor& staging = g.staging[p.bucket];
    if (!staging.defined()) staging = r.acquire_staging(g.index, b.numel);
    staging.narrow(0, p.offset - b.offset, p.numel).add_(flat);
  }
  // Reduce-scatter the staging buffer in place; this rank's chunk of the average is then added
  // into its gradient shard (or sent to the host: send_reduced_chunks) and the buffer goes back to
  // the group's pool.
  void reduce_bucket(ZeroGroup& g, int bucket, Reductions& r, std::function<void()> done) override {
    const FlatBucket& b = g.layout.buckets[bucket];
    if (!g.staging[bucket].defined()) g.staging[bucket] = r.acquire_staging(g.index, b.numel);  // no gradient arrived
    at::Tensor staging = g.staging[bucket];
    g.staging[bucket] = at::Tensor();
    at::Tensor shard = reduced_to_ ? at::Tensor() : gradient_chunk(g, bucket);
    const int pool = g.index;
    ReducedChunk to = reduced_to_;
    ZeroGroup* group = &g;
    auto keep = [to, group, bucket, shard](at::Tensor& reduced) mutable {
      if (to) to(*group, bucket, reduced);
      else shard.add_(reduced);
    };
    if (g.comm->size() == 1) {
      keep(staging);
      r.release_staging(pool, staging);
      if (done) done();
      return;
    }
    at::Tensor mine = staging.narrow(0, g.comm->rank() * b.shard, b.shard);
    reduce_into_own_chunk(r, *g.comm, staging, mine,
                          [&r, pool, keep, mine, staging, done = std::move(done)]() mutable {
                            keep(mine);
                            r.release_staging(pool, staging);
                            if (done) done();
                          });
  }
  at::Tensor gradient_chunk(ZeroGroup& g, int bucket) override {
    const FlatBucket& b = g.layout.buckets[bucket];
    return g.grads.narrow(0, b.shard_offset, b.shard);
  }
 private:
  int number_;
};

std::unique_ptr<ZeroStage> make_stage2(at::ScalarType wire, bool reduce_scatter) {
  return std::make_unique<Stage2>(2, wire, reduce_scatter);
}

std::unique_ptr<ZeroStage> make_stage3(at::ScalarType wire, bool reduce_scatter) {
  return std::make_unique<Stage2>(3, wire, reduce_scatter);
}

}  // namespace tessera
