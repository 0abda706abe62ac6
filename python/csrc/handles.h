// What several binding files share: the resolved config, a parameter group as Python passes it,
// and tessera.zero.Init's C++ half.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/config/config_io.h"
#include "parallel/parallel_context.h"
#include "zero/model.h"
#include "zero/partitioned_init.h"

namespace tessera {

// A resolved Config, opaque to Python except for its effective JSON.
struct ConfigHandle {
  Config config;
  ResolvedLayout layout;
};

// A parameter group as Python passes it: (params, lr, weight_decay, name, param names, tensor splits
// as (dim, fused) with dim -1 for a replicated parameter, communicator: "" is the data group, gradient
// scale: ParamGroup::gradient_scale).
using GroupTuple = std::tuple<std::vector<at::Tensor>, std::optional<double>, std::optional<double>, std::string,
                              std::vector<std::string>, std::vector<std::pair<int64_t, int64_t>>, std::string, double>;

inline ModelDescription description_of(const std::vector<GroupTuple>& groups) {
  ModelDescription model;
  for (const auto& [params, lr, weight_decay, name, names, splits, communicator, scale] : groups) {
    model.groups.push_back(ParamGroup{params, lr, weight_decay, name, names, {}, {}});
    for (const auto& [dim, fused] : splits) model.groups.back().tensor_splits.push_back(TensorSplit{dim, fused});
    model.groups.back().communicator = communicator;
    model.groups.back().gradient_scale = scale;
  }
  return model;
}

// tessera.zero.Init's C++ half (zero/partitioned_init.h), with the context its communicator lives in.
struct InitHandle {
  std::shared_ptr<ParallelContext> context;
  std::unique_ptr<PartitionedInit> init;
};

}  // namespace tessera
