// Whether the engine can run a config in this job: the combinations of keys, and of keys with the
// job (its grid, its device, the model), decided in one place before anything is built. The
// config's own checks (types, ranges, the batch-size arithmetic) are engine/config/'s; what needs the
// job is here. Errors throw ConfigError naming the JSON path and what to use instead; what the
// engine runs differently from what was asked comes back as notes for rank 0 to print.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "parallel/topology.h"

namespace tessera {

struct RunContext {
  GridShape grid;                     // the job's data × tensor × pipe shape
  c10::Device device = c10::kCPU;     // the data group's collectives' device
  bool nccl = false;                  // the data group's backend
  bool pipeline_stage = false;        // the Engine trains one stage of a PipelineEngine
  int64_t parameters = 0;             // this rank's parameter elements
  bool tensor_sliced = false;         // some parameter is marked tensor-sharded
  bool host_staging = false;          // TESSERA_HOST_STAGING=1: CPU ranks take the GPU ranks' host path
};

std::vector<std::string> check_runnable(const Config& config, const RunContext& run);

}  // namespace tessera
