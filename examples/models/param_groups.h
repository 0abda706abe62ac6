// nanoGPT's parameter groups: weight decay on matrices (dim >= 2), none on biases, norms and
// other vectors.
#pragma once

#include <vector>

#include "engine/engine.h"

namespace tessera::examples {

inline ModelDescription decay_groups(const std::vector<at::Tensor>& params, double weight_decay) {
  ParamGroup decay, no_decay;
  decay.name = "decay";
  decay.weight_decay = weight_decay;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0;
  for (const auto& t : params) (t.dim() >= 2 ? decay : no_decay).params.push_back(t);
  ModelDescription model;
  model.groups.push_back(std::move(decay));
  model.groups.push_back(std::move(no_decay));
  return model;
}

}  // namespace tessera::examples
