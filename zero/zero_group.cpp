// ZeroGroup's invariants (zero/zero_group.h), checked in one place after construction.
#include "zero/zero_group.h"

#include "parallel/communicator.h"

#include <stdexcept>
#include <string>

namespace tessera {

void ZeroGroup::check() const {
  auto fail = [&](const std::string& what) {
    throw std::logic_error("tessera: ZeRO group " + std::to_string(index) + " (" +
                           (names.empty() ? std::string("no parameters") : names.front()) + ", ...): " + what);
  };
  const size_t buckets = layout.buckets.size();
  if (params.size() != layout.params.size() || names.size() != params.size() || unit_of.size() != params.size())
    fail("its parameters, names and units do not match its layout");
  if (tensor_splits.size() != params.size()) fail("a tensor split per parameter");
  for (const TensorSplit& split : tensor_splits)
    if (split.sharded() != tensor_sharded) fail("a tensor-parallel slice and a replicated parameter in one group");
  if (segments.size() != buckets || pending.size() != buckets || staging.size() != buckets)
    fail("a segment, counter and staging slot per bucket");
  if (partitioned != !gathered.empty() || (partitioned && gathered.size() != buckets))
    fail("a gathered buffer per bucket exactly when partitioned");
  if (!comm) fail("no communicator");
  if (layout.partitions != 1 && comm && layout.partitions != comm->size())
    fail("laid out over " + std::to_string(layout.partitions) + " ranks, reduced over " + std::to_string(comm->size()));
  if (partitioned && !gather_comm) fail("partitioned without a communicator for its gathers");
  if (!optimizer) fail("no optimizer");
  if (master.defined() && (!mixed_precision || master.numel() != layout.shard_numel))
    fail("an fp32 master of " + std::to_string(master.numel()) + " elements, the shard has " +
         std::to_string(layout.shard_numel));
  if (compute.defined() && compute.numel() != (partitioned ? layout.shard_numel : layout.total))
    fail("a compute buffer of " + std::to_string(compute.numel()) + " elements");
  for (size_t b = 0; b < buckets; ++b)  // (undefined: the gradients go straight to the host)
    if (segments[b].grads.defined() && segments[b].grads.numel() != layout.buckets[b].shard &&
        segments[b].grads.numel() != layout.buckets[b].numel)
      fail("bucket " + std::to_string(b) + "'s gradient chunk is neither its shard nor the bucket");
}

}  // namespace tessera
