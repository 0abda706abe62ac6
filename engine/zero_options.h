// The config's zero_optimization, precision, optimizer and aio sections as ZeroOptions
// (zero/zero_optimizer.h), with what the environment decides (engine/environment.h): the one place
// the Engine copies the config into ZeRO's options.
#pragma once

#include "engine/config/config.h"
#include "engine/environment.h"
#include "zero/zero_optimizer.h"

namespace tessera {

// `rank` names the swap files; `data_size` is the data-parallel degree (prescale_gradients).
ZeroOptions zero_options_from_config(const Config& c, int rank, int data_size, const EngineEnvironment& env);

}  // namespace tessera
