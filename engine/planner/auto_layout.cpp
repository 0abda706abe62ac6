#include "engine/planner/auto_layout.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "engine/planner/planner.h"

namespace tessera::planner {

using nlohmann::json;

namespace {

// The value at a dotted config path ("zero_optimization.stage"), or null when absent.
const json* at(const json& config, std::string path) {
  std::replace(path.begin(), path.end(), '.', '/');
  const json::json_pointer pointer("/" + path);
  return config.contains(pointer) ? &config.at(pointer) : nullptr;
}

bool is_auto(const json* v) { return v && v->is_string() && v->get<std::string>() == "auto"; }

}  // namespace

const std::vector<std::string>& auto_layout_paths() {
  static const std::vector<std::string> paths = {
      "zero_optimization.stage", "train_micro_batch_size_per_gpu", "tensor_parallel.tp_size", "pipeline.stages",
      "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
      "activation_checkpointing.number_checkpoints", "pipeline.activation_checkpoint_interval", "moe.ep_size",
      "pipeline.schedule", "context_parallel.size", "sequence_parallel_size"};
  return paths;
}

bool has_auto_layout(const json& config) {
  // train_micro_batch_size_per_gpu alone is Hugging Face's placeholder (derived from the batch
  // keys, engine/config); it is the planner's only with another layout key.
  for (const auto& path : auto_layout_paths())
    if (path != "train_micro_batch_size_per_gpu" && is_auto(at(config, path))) return true;
  return false;
}

AutoLayout resolve_auto_layout(const json& config, int world, const json& plan_request) {
  AutoLayout out;
  out.config = config;
  if (!has_auto_layout(config)) return out;
  auto bad = [](const std::string& path, const std::string& what) { throw std::invalid_argument(path + ": " + what); };
  const json* batch = at(config, "train_batch_size");
  if (!batch || !batch->is_number_integer())
    bad("train_batch_size", "the layout planner keeps the global batch fixed: set it to a number when a layout key is \"auto\"");
  json request = plan_request.is_object() ? plan_request : json::object();
  if (request.contains("measure"))
    bad("measure", "not at start: each rank would time the probe itself and could choose differently; run `tessera plan "
                   "--measure` once and give its calibration_cache, or give the rates");
  // Every rank resolves the config on its own and must choose the same: the given rates, a given
  // calibration file, or the defaults; never this process's own measurements.
  if (!request.contains("calibration_cache")) request["calibration_cache"] = "";
  request["global_batch"] = batch->get<int64_t>();
  if (!request.contains("gpus_per_node") && !request.contains("nodes")) request["gpus_per_node"] = world;
  // Every layout key that is not "auto" is fixed at its value (or its default).
  std::vector<std::string> searched;
  auto fix = [&](const std::string& path, const char* key, const json& fallback) {
    const json* v = at(config, path);
    if (is_auto(v)) {
      searched.push_back(path);
      return;
    }
    request[key] = v && !v->is_null() ? *v : fallback;
  };
  fix("zero_optimization.stage", "zero", 0);
  fix("tensor_parallel.tp_size", "tp", 1);
  fix("pipeline.stages", "pp", 1);
  fix("zero_optimization.offload_optimizer.device", "offload_optimizer", "none");
  fix("zero_optimization.offload_param.device", "offload_param", "none");
  if (at(config, "moe")) fix("moe.ep_size", "ep", 1);
  fix("pipeline.schedule", "schedule", "1f1b");
  if (const json* v = at(config, "pipeline.virtual_stages"); v && v->is_number_integer() && v->get<int>() > 1)
    request["virtual_stages"] = *v;
  // Context parallelism: context_parallel.size, or DeepSpeed's top-level sequence_parallel_size.
  const json* cp = at(config, "context_parallel.size");
  const char* cp_path = "context_parallel.size";
  if (!cp && at(config, "sequence_parallel_size")) cp = at(config, "sequence_parallel_size"), cp_path = "sequence_parallel_size";
  if (is_auto(cp)) {
    searched.push_back(cp_path);
    request["cp_search"] = true;
  } else {
    request["cp"] = cp && !cp->is_null() ? *cp : json(1);
  }
  // Checkpointing: "auto" at either key searches with and without it (the planner writes the one
  // the layout's pipeline reads); otherwise the estimator's rule: an interval, or the section.
  const json* interval = at(config, "pipeline.activation_checkpoint_interval");
  const json* section = at(config, "activation_checkpointing");
  const json* number = at(config, "activation_checkpointing.number_checkpoints");
  if (is_auto(interval) || is_auto(number)) {
    searched.push_back(is_auto(number) ? "activation_checkpointing.number_checkpoints" : "pipeline.activation_checkpoint_interval");
  } else {
    const bool asks = (interval && interval->is_number() && interval->get<int>() > 0) ||
                      (section && section->is_object() &&
                       (section->value("partition_activations", false) || section->value("cpu_checkpointing", false) ||
                        (number && number->is_number())));
    request["activation_checkpointing"] = asks ? "full" : "none";
  }
  const json* micro = at(config, "train_micro_batch_size_per_gpu");
  const json* accumulation = at(config, "gradient_accumulation_steps");
  if (micro && !is_auto(micro)) {
    request["micro_batch"] = *micro;
  } else {
    searched.push_back("train_micro_batch_size_per_gpu");
    if (accumulation && !is_auto(accumulation))
      bad("gradient_accumulation_steps", "leave it out (or \"auto\") when the planner chooses the micro-batch: it follows "
                                         "from train_batch_size / (micro-batch x data-parallel size)");
  }
  // The config's other keys (optimizer, precision, ...) are the plan's base config.
  json base = config;
  base.erase("train_micro_batch_size_per_gpu");
  base.erase("gradient_accumulation_steps");
  request["config"] = base;
  const PlanResult plan = planner::plan(plan_inputs_from_json(request));
  if (plan.ranked.empty()) {
    std::string why;
    for (const auto& r : plan.rejected)
      if (r.kind == "memory") {
        why = ": e.g. " + r.layout.label() + ": " + r.reason;
        break;
      }
    bad(searched.front(), "\"auto\": no layout of the " + std::to_string(world) + " ranks fits and runs" + why);
  }
  const Candidate& best = plan.ranked.front();
  out.config = best.config;
  // The keys the base config had beside the layout (as_config writes the layout's).
  char text[512];
  std::string keys;
  for (const auto& s : searched) keys += (keys.empty() ? "" : ", ") + s;
  std::snprintf(text, sizeof text, "tessera: auto layout for %d ranks: %s (searched %s): predicted %.4g s a step, the fastest of %zu that fit",
                world, best.layout.label().c_str(), keys.c_str(), best.cost.total(), plan.ranked.size());
  out.line = text;
  if (plan.ranked.size() > 1) {
    const Candidate& next = plan.ranked[1];
    std::snprintf(text, sizeof text, "; next %s, %.1f%% slower (%s)", next.layout.label().c_str(),
                  100 * (next.cost.total() / best.cost.total() - 1), next.cost.bound().c_str());
    out.line += text;
  }
  out.line += "; rates: " + plan.calibration.tflops.source;
  return out;
}

}  // namespace tessera::planner
