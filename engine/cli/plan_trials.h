// `tessera plan --trials K -- PROGRAM ARGS`: the planner's top K layouts run for a few steps each
// with the real engine (as DeepSpeed's autotuner runs its experiments), their step times read from
// the progress lines, measured against predicted. The program gets each layout's config as
// `--config FILE` (or where an argument is `{config}`), under `tessera launch`.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/planner/planner.h"

namespace tessera {

struct TrialOptions {
  std::vector<std::string> program;  // the training program and its arguments
  std::string hostfile;              // "": one node, gpus_per_node ranks
  int master_port = 29650;
  double timeout_s = 1800;           // per trial
};

struct Trial {
  int rank = 0;                      // the planner's rank of the layout (1 = its first choice)
  planner::Layout layout;
  double predicted = 0;              // seconds per step
  std::optional<double> measured;    // the median of the progress lines' step times after the first
  std::string error;                 // why it has no measurement
  nlohmann::json config;
};

// Runs the first `k` ranked layouts one after the other. Prints each trial's start on stderr.
std::vector<Trial> run_trials(const planner::PlanResult& plan, int k, const TrialOptions& options);

// The fastest measured trial (nullptr when none ran).
const Trial* fastest(const std::vector<Trial>& trials);

nlohmann::json trials_to_json(const std::vector<Trial>& trials);
std::string format_trials(const std::vector<Trial>& trials);

}  // namespace tessera
