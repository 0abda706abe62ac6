#include "zero/buffer_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tessera {

BufferPlan plan_buffers(const BufferPlanInput& in) {
  if (in.stage < 0 || in.stage > 2)
    throw std::invalid_argument("tessera: the buffer planner covers ZeRO stages 0-2, not " + std::to_string(in.stage));
  if (in.data_parallel < 1) throw std::invalid_argument("tessera: the data-parallel degree must be at least 1");
  BufferPlan plan;
  plan.partitions = in.stage == 0 ? 1 : in.data_parallel;
  const bool mixed = in.compute_bytes != 4;
  int64_t shards = 0;
  for (const auto& numels : in.group_numels) {
    if (numels.empty()) continue;
    GroupBuffers g;
    g.layout = FlatLayout::build(numels, plan.partitions, in.bucket_numel);
    g.compute_numel = g.layout.total;
    g.master_numel = mixed ? g.layout.shard_numel : 0;
    g.grad_numel = in.stage == 2 ? g.layout.shard_numel : g.layout.total;
    g.state_numel = in.state_floats * g.layout.shard_numel;
    for (const FlatBucket& b : g.layout.buckets) {
      plan.largest_bucket = std::max(plan.largest_bucket, b.numel);
      plan.largest_chunk = std::max(plan.largest_chunk, b.shard);
    }
    plan.parameter_bytes += int64_t(in.compute_bytes) * g.compute_numel;
    plan.master_bytes += 4 * g.master_numel;
    plan.gradient_bytes += 4 * g.grad_numel;
    plan.state_bytes += 4 * g.state_numel;
    shards += g.layout.shard_numel;
    plan.groups.push_back(std::move(g));
  }
  const bool distributed = in.data_parallel > 1;
  if (in.stage == 1 && distributed) plan.communication_bytes = 4 * shards;
  if (in.stage == 2) {
    plan.staging_buffers = static_cast<int>(plan.groups.size());
    plan.communication_bytes = int64_t(plan.staging_buffers) * 4 *
                               (plan.largest_bucket + (distributed ? plan.largest_chunk : 0));
  }
  return plan;
}

}  // namespace tessera
