#include "zero/buffer_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tessera {

BufferPlan plan_buffers(const BufferPlanInput& in) {
  if (in.stage < 0 || in.stage > 3)
    throw std::invalid_argument("tessera: the buffer planner covers ZeRO stages 0-3, not " + std::to_string(in.stage));
  if (in.data_parallel < 1) throw std::invalid_argument("tessera: the data-parallel degree must be at least 1");
  BufferPlan plan;
  plan.partitions = in.stage == 0 ? 1 : in.data_parallel;
  const bool mixed = in.compute_bytes != 4;
  const bool sharded_gradients = in.stage >= 2;
  for (size_t gi = 0; gi < in.group_numels.size(); ++gi) {
    const auto& numels = in.group_numels[gi];
    if (numels.empty()) continue;
    GroupBuffers g;
    static const std::vector<int> no_keys;
    const std::vector<int>& keys = gi < in.group_keys.size() ? in.group_keys[gi] : no_keys;
    const int partitions = in.stage == 0 || gi >= in.group_partitions.size() ? plan.partitions : in.group_partitions[gi];
    if (partitions < 1) throw std::invalid_argument("tessera: group " + std::to_string(gi) + " is partitioned over " + std::to_string(partitions) + " ranks");
    g.layout = FlatLayout::build(numels, partitions, in.bucket_numel, keys);
    g.partitioned = in.stage == 3 && (gi >= in.group_partitioned.size() || in.group_partitioned[gi]);
    g.compute_numel = g.partitioned ? g.layout.shard_numel : g.layout.total;
    g.master_numel = mixed ? g.layout.shard_numel : 0;
    g.grad_numel = sharded_gradients ? g.layout.shard_numel : g.layout.total;
    g.state_numel = in.state_floats * g.layout.shard_numel;
    for (const FlatBucket& b : g.layout.buckets) g.largest_bucket = std::max(g.largest_bucket, b.numel);
    plan.largest_bucket = std::max(plan.largest_bucket, g.largest_bucket);
    if (sharded_gradients) {
      g.staging_buffers = std::min<int>(2, static_cast<int>(g.layout.buckets.size()));
      plan.staging_buffers += g.staging_buffers;
      plan.communication_bytes += int64_t(g.staging_buffers) * 4 * g.largest_bucket;
    }
    plan.parameter_bytes += int64_t(in.compute_bytes) * g.compute_numel;
    plan.master_bytes += 4 * g.master_numel;
    plan.gradient_bytes += int64_t(sharded_gradients ? 4 : in.gradient_bytes) * g.grad_numel;
    plan.state_bytes += 4 * g.state_numel;
    plan.groups.push_back(std::move(g));
  }
  const bool communicates = in.data_parallel > 1 || std::any_of(in.group_partitions.begin(), in.group_partitions.end(), [](int p) { return p > 1; });
  if (communicates) {
    // Reductions::kMaxInFlight reductions in flight, each with a copy of its bucket in the wire
    // dtype when that is not fp32, and, at stages 1–2 on Gloo, the backend's copy of its input.
    const int bucket_bytes = sharded_gradients ? 4 : in.gradient_bytes;  // stages 2–3 reduce their fp32 staging
    const int64_t per_reduction = (in.wire_bytes != bucket_bytes ? in.wire_bytes : 0) +
                                  (in.stage > 0 && in.backend_copies_reductions ? in.wire_bytes : 0);
    plan.in_flight_bytes = 2 * per_reduction * plan.largest_bucket;
    plan.communication_bytes += plan.in_flight_bytes;
  }
  return plan;
}

}  // namespace tessera
