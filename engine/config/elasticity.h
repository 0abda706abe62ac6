// DeepSpeed's elastic batch layout ("elasticity", DeepSpeed's elasticity/elasticity.py, versions
// 0.1 and 0.2): one global batch size that splits evenly over many world sizes, so a job that
// loses or gains nodes keeps training the same batch. The global batch is a candidate
// base × HCN (a highly composite number: many divisors), the base being each micro-batch size and
// their least common multiple, HCN the largest that keeps it within max_train_batch_size; the
// candidate that divides into the most world sizes within [min_gpus, max_gpus] wins (ties: the
// larger batch with prefer_larger_batch, else the smaller). Version 0.2 counts nodes of
// num_gpus_per_node / model_parallel_size data-parallel ranks instead of ranks, and a data-parallel
// size that is not one of the valid ones gets the largest (or smallest) batch a micro-batch size
// fits within the maximum. At a data-parallel size the micro-batch is the largest of
// micro_batch_sizes that divides its share, and gradient accumulation makes up the rest.
// Computed as DeepSpeed computes it (tests/python/engine/test_elasticity.py compares with
// deepspeed.elasticity.compute_elastic_config itself).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace tessera {

struct ElasticBatch {
  int64_t train_batch_size = 0;
  std::vector<int64_t> valid_sizes;  // the data-parallel sizes this batch divides into
  int64_t micro_batch = 0;           // at the data-parallel size asked for
  int64_t gradient_accumulation_steps = 0;
};

// An elasticity section that cannot work, or a data-parallel size outside its valid sizes.
// `path` is the key to name ("elasticity.micro_batch_sizes"; the world size's: "elasticity").
struct ElasticityError : std::invalid_argument {
  ElasticityError(std::string path, const std::string& message)
      : std::invalid_argument(message), path(std::move(path)) {}
  std::string path;
};

// The layout for `data_parallel_size` ranks (what DeepSpeed's runtime passes as world_size).
ElasticBatch compute_elastic_batch(const ElasticityConfig& e, int64_t data_parallel_size);

}  // namespace tessera
