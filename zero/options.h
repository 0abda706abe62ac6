// What zero/ takes from zero_optimization's sizes, as plain data with every default written once
// (DeepSpeed's names and defaults): engine/config/config.h's ZeroConfig derives from it (these are
// its JSON keys), so does the memory estimator's TrainingSetup, and ZeroOptions, PartitionedOptions
// and the buffer planner take their defaults from it. The offload buffers' defaults are
// offload/options.h's.
#pragma once

#include <cstdint>

#include "offload/options.h"

namespace tessera {

struct ZeroSizeParams {
  int64_t reduce_bucket_size = 500'000'000;      // elements per gradient bucket
  int64_t allgather_bucket_size = 500'000'000;   // elements per allgather (buckets are reduce_bucket_size)
  int64_t sub_group_size = kOptimizerSwapTileNumel;  // NVMe optimizer offload: elements per tile
  int64_t stage3_prefetch_bucket_size = 50'000'000;          // elements gathered ahead of use
  int64_t stage3_param_persistence_threshold = 100'000;      // smaller parameters stay whole
  int64_t stage3_max_live_parameters = 1'000'000'000;        // elements gathered at once, at most
  int64_t stage3_max_reuse_distance = 1'000'000'000;         // kept gathered when reused within it
};

}  // namespace tessera
