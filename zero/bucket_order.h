// The orders in which one step visits the engine's buckets, each a (group, bucket) pair:
//
//   reduction order  the order gradients are reduced in, the same on every rank. Backward fills a
//                    group's buckets first to last (the flat layout reverses registration order,
//                    zero/flat_layout.h), so group by group, bucket by bucket; at ZeRO-3, across
//                    groups by unit, the last unit first (backward finishes units in reverse), with
//                    the persistent groups' buckets (no unit key) after them.
//   unit buckets     the buckets each unit's forward reads: its own parameters' and shared ones'.
//   forward order    the order the next forward reads every bucket: unit by unit, then the buckets
//                    no unit lists (without units, each group's last bucket first). Stages 1-2
//                    launch their post-step allgathers in this order; ZeRO-3 prefetches along it.
#pragma once

#include <vector>

#include "zero/units.h"
#include "zero/zero_group.h"

namespace tessera {

BucketOrder reduction_order(const Groups& groups, bool by_unit);
std::vector<BucketOrder> buckets_by_unit(const Groups& groups, const UnitTracker& units);
BucketOrder forward_order(const Groups& groups, const std::vector<BucketOrder>& unit_buckets);

}  // namespace tessera
