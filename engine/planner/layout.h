// A layout: how one training job is spread over its ranks and what each rank keeps. The planner
// (engine/planner/planner.h) enumerates them, the estimator says whether one fits, the step-cost
// model how fast it runs; as_config writes one as the config keys that ask for it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/estimator/estimator.h"

namespace tessera::planner {

struct Layout {
  // The grid: world = dp · tp · pp · cp (the config's pipe × data × context × tensor).
  int dp = 1, tp = 1, pp = 1, cp = 1;
  // MoE models: the data-parallel ranks an MoE layer's experts are spread over (moe.ep_size,
  // carved out of dp: it divides dp and the experts); 1 for a dense model.
  int ep = 1;
  // pipeline.schedule: "1f1b" (always without a pipeline), "zb_h1", "interleaved_1f1b" with
  // virtual_stages model chunks a stage, or "zb_v" (virtual_stages 2) (GPipe has 1F1B's bubble and holds more: searched only when asked).
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  int zero_stage = 0;
  std::string offload_optimizer = "none";  // none | cpu | nvme
  std::string offload_param = "none";      // none | cpu | nvme (ZeRO-3)
  std::string activation_checkpointing = "none";  // none | full
  // The batch: global = micro_batch · gradient_accumulation · dp (under a pipeline the
  // accumulation steps are its micro-batches, DeepSpeed's rule).
  int64_t micro_batch = 1;
  int64_t gradient_accumulation = 1;

  int world() const { return dp * tp * pp * cp; }
  int64_t global_batch() const { return micro_batch * gradient_accumulation * dp; }
  // "dp 2 · tp 2 · zero 1 · micro 4 × 2", the parts that are not the default only.
  std::string label() const;
};

// `setup` with the layout's choices written over it (the estimator's input for this layout).
TrainingSetup apply(const Layout& layout, TrainingSetup setup);

// The config keys that ask for `layout`, merged into `base` (a config JSON: its optimizer,
// precision and every other key are kept; the layout's keys are replaced). NVMe offload takes its
// nvme_path from `base` or `nvme_path`. Activation checkpointing under a pipeline is
// pipeline.activation_checkpoint_interval; without one it is the activation_checkpointing section
// (number_checkpoints = layers), which a model reads (train_gpt: --checkpoint-activations).
nlohmann::json as_config(const Layout& layout, nlohmann::json base, int64_t layers,
                         const std::string& nvme_path = "/local_nvme");

nlohmann::json to_json(const Layout& layout);

}  // namespace tessera::planner
