// "auto" in a config's layout keys, resolved by the planner for the world at hand: the ZeRO stage,
// the micro-batch (gradient accumulation follows from train_batch_size), the tensor and pipeline
// degrees, the optimizer and parameter offload devices, and activation checkpointing
// (activation_checkpointing.number_checkpoints or pipeline.activation_checkpoint_interval), and an
// MoE model's expert degree (moe.ep_size), and the pipeline's schedule (pipeline.schedule: 1F1B,
// ZB-H1, ZB-V or interleaved with pipeline.virtual_stages chunks, 2 unless given). Only the keys that say "auto" are
// searched; every other layout key keeps its value (or its default). The answer is the config with
// the chosen values written in, and one line that says what was chosen and why.
//
// The planner needs the model and the hardware, which a config does not describe: the caller
// gives them as a plan request's keys ("preset" or the shape, "device", "gpu_mem", rates, ...;
// docs/planner.md). `tessera config check --plan-*`, tessera.load_config(..., plan=...) and
// train_gpt (its own shape) call this before the config is read, so each resolves it the same way.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::planner {

// The JSON paths "auto" may take here.
const std::vector<std::string>& auto_layout_paths();

// Whether any of them is "auto" in `config`.
bool has_auto_layout(const nlohmann::json& config);

struct AutoLayout {
  nlohmann::json config;  // with every "auto" layout key replaced
  std::string line;       // "tessera: auto layout for 4 ranks: ... (why)"; empty when nothing was "auto"
};

// Throws std::invalid_argument naming the key when the config cannot be planned (no
// train_batch_size, gradient_accumulation_steps fixed while the micro-batch is "auto", no model,
// nothing fits).
AutoLayout resolve_auto_layout(const nlohmann::json& config, int world, const nlohmann::json& plan_request);

}  // namespace tessera::planner
