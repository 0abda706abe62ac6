// The default residences (zero/residence.h): the optimizer steps the group's own buffers, its state
// held by the optimizer, the parameter shard in memory. The other sites override what differs.
#include "zero/residence.h"

#include <stdexcept>

namespace tessera {

void StepSite::add_memory(const ZeroGroup& g, MemoryReport& m) const {
  if (g.master.defined()) m.master_parameters += g.master.nbytes();
  m.optimizer_states += g.optimizer->state_bytes();
}

void StateSite::step(const BucketOrder& order, const BindBucket& bind, const StepPiece& step, const BucketDone& done) {
  for (const auto& [group, bucket] : order) {
    step(group, bind(group, bucket), {});
    done(group, bucket);
  }
}

void StateSite::write_master(ZeroGroup& g, int bucket, const at::Tensor& values) {
  const FlatBucket& k = g.layout.buckets[bucket];
  g.master.narrow(0, k.shard_offset, k.shard).copy_(values);
}

void StateSite::compute_follows_master(ZeroGroup& g) {
  if (!g.mixed()) return;
  for (ShardSegment& s : g.segments) s.compute_copy.copy_(s.params);
}

CheckpointState StateSite::read(const ZeroGroup& g) {
  CheckpointState state;
  state.named = g.optimizer->named_state();
  return state;
}

void StateSite::write(ZeroGroup&, const std::vector<at::Tensor>&) {
  throw std::logic_error("tessera: the optimizer state is in memory: a checkpoint writes it through the named state");
}

void ParameterSite::write(ZeroGroup& g, int bucket, const at::Tensor& values) {
  const FlatBucket& k = g.layout.buckets[bucket];
  g.compute.narrow(0, k.shard_offset, k.shard).copy_(values);
}

namespace {
class InPlaceStep final : public StepSite {};
class StateInMemory final : public StateSite {};
class ParametersInMemory final : public ParameterSite {};
}  // namespace

std::unique_ptr<StepSite> make_in_place_step() { return std::make_unique<InPlaceStep>(); }
std::unique_ptr<StateSite> make_state_in_memory() { return std::make_unique<StateInMemory>(); }
std::unique_ptr<ParameterSite> make_parameters_in_memory() { return std::make_unique<ParametersInMemory>(); }

}  // namespace tessera
