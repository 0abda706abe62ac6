// nanoGPT's parameter groups: weight decay on matrices (dim >= 2), none on biases, norms and
// other vectors.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"

namespace tessera::examples {

// `names`, when given, one per parameter: the names checkpoints find them by, whatever the layout.
inline ModelDescription decay_groups(const std::vector<at::Tensor>& params, double weight_decay,
                                     const std::vector<std::string>& names = {}) {
  ParamGroup decay, no_decay;
  decay.name = "decay";
  decay.weight_decay = weight_decay;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamGroup& g = params[i].dim() >= 2 ? decay : no_decay;
    g.params.push_back(params[i]);
    if (!names.empty()) g.param_names.push_back(names[i]);
  }
  ModelDescription model;
  model.groups.push_back(std::move(decay));
  model.groups.push_back(std::move(no_decay));
  return model;
}

}  // namespace tessera::examples
