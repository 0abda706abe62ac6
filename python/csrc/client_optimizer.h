// A script's own torch optimizer as the engine's FlatOptimizer (DeepSpeed's zero_allow_untested_optimizer).
//
// tessera.initialize(optimizer=torch.optim.Adagrad(...)) with a kind the engine does not implement:
// the Python object tessera.client_optimizer.ShardOptimizer holds the client optimizer, whose param
// groups now list this rank's shard of each ZeRO group (one fp32 tensor per bucket: the views in
// ShardSegment::params, the fp32 values the engine updates in place), and steps it. This file is
// the thin C++ side: each ZeRO group's optimizer hands its step, state and checkpoint calls to that
// object under the GIL (the engine's step runs without it).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "zero/model.h"

namespace tessera {

// The factory ModelDescription::client_optimizer takes, over `runner` (a ShardOptimizer): each ZeRO
// group's segments are bound to it when the group is built.
ClientOptimizerFactory client_optimizer_factory(pybind11::object runner);

}  // namespace tessera
