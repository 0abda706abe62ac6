// The layout planner (`tessera plan`, tessera.plan): for a model, the hardware and a global batch,
// every layout of the world (engine/planner/layout_space.h) is checked by the engine's own rules
// (the config it would be is checked as `tessera config check` does), sized by the memory
// estimator (does it fit), and timed by the step-cost model (engine/planner/step_cost.h) on stated
// rates (engine/planner/calibration.h); the layouts that fit are ranked by predicted step time.
// Every layout not chosen says why: the shape or the batch rules it out, the engine does not run
// it, it does not fit, or it is slower, and by which term (bubble, tensor, data, ...).
//
//   nlohmann::json answer = tessera::planner::plan_json(request);  // what `tessera plan --json` prints
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/estimator/estimator.h"
#include "engine/planner/calibration.h"
#include "engine/planner/layout.h"
#include "engine/planner/layout_space.h"
#include "engine/planner/step_cost.h"

namespace tessera::planner {

struct PlanInputs {
  EstimateInputs base;            // the model, the hardware and what the layout does not decide
  nlohmann::json base_config;     // the config each layout is written into (optimizer, precision, ...)
  int64_t global_batch = 0;       // samples per optimizer step (train_batch_size)
  SpaceLimits limits;
  Calibration calibration;
  std::string nvme_path = "/local_nvme";
};

struct Candidate {
  Layout layout;
  StepCost cost;
  int64_t per_rank_bytes = 0;     // the estimator's peak per GPU (per rank)
  int64_t per_node_cpu_bytes = 0;
  double samples_per_second = 0;
  nlohmann::json config;          // the config keys that ask for it (as_config)
};

struct PlanResult {
  int world = 1;
  int64_t global_batch = 0;
  std::string model;
  std::vector<Candidate> ranked;       // every layout that fits and the engine runs, fastest first
  std::vector<Rejection> rejected;     // the rest that could not run, with the reason
  Calibration calibration;
  std::vector<std::string> notes;
  int considered = 0;                  // layouts enumerated (grids rejected whole count once)
};

// Throws std::invalid_argument for inputs that cannot be planned (no shape, no global batch, ...).
PlanResult plan(const PlanInputs& inputs);

nlohmann::json plan_to_json(const PlanResult& result, int top = 5);
std::string format_plan(const PlanResult& result, int top = 5);

// A JSON request: the estimate request's keys (engine/estimator/estimator.h: the model, the
// hardware, "config", "precision", ...), where the layout's keys ("zero", "tp", "pp", "cp", "ep",
// "micro_batch", "offload_optimizer", "offload_param", "activation_checkpointing", "schedule") fix that choice
// instead of setting it, plus the planner's own: "global_batch" (required), "measure" (run the
// CPU probe now), "calibration_cache", "cores_per_node", "max_tp", "offload" (false: never
// offload), "cp_search" (false: no context parallelism), "collective_latency_us",
// "device_memory_bw", "nvme_path", "virtual_stages" (the interleaved schedule's chunks a stage, 2).
PlanInputs plan_inputs_from_json(const nlohmann::json& request);
nlohmann::json plan_json(const nlohmann::json& request, int top = 5);

}  // namespace tessera::planner
