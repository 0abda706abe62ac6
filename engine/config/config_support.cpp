// The table of config keys the engine does not act on yet (engine/config/config_support.h), and the
// check that names the ones a config sets to anything but a value that changes nothing.
//
// Which keys are here was found by reading the code: a key is on the list when nothing in engine/,
// zero/, optim/ reads its Config field (or reads it only to refuse it). What the engine does read:
// the batch triple; optimizer type and params (Adam/AdamW: lr, betas, eps, weight_decay,
// bias_correction, adam_w_mode; SGD: momentum, dampening, nesterov; Lamb: max_coeff, min_coeff;
// the 1-bit family: freeze_step, var_freeze_step, var_update_scaler, local_step_scaler,
// local_step_clipper, coeff_beta, factor_max, factor_min, factor_threshold, comm_backend_name,
// cuda_aware: optim/onebit.h and the engine's check of the backend);
// every scheduler key; fp16.*, bf16.enabled, gradient_clipping, steps_per_print,
// wall_clock_breakdown; zero_optimization.stage, reduce_bucket_size, overlap_comm,
// reduce_scatter, ignore_unused_parameters (and, accepted as changing nothing here, with the reason
// in docs/config.md: allgather_bucket_size, contiguous_gradients, allgather_partitions,
// round_robin_gradients); tensor_parallel.tp_size and .sequence_parallel (the model applies them:
// parallel/tensor_parallel/); pipeline.stages (checked against the parallel context; more than one
// runs through PipelineEngine), .schedule, .dynamic_shape, .partition_method and
// .activation_checkpoint_interval (PipelineEngine, tessera.pipe.PipelineModule; a C++ stage model
// checkpoints its own layers); pipeline.micro_batches (must equal gradient_accumulation_steps);
// unknown_keys (the parser); flops_profiler (engine/flops_profiler.h; python/tessera/flops_profiler.py),
// memory_breakdown (engine/progress.h); csv_monitor, tensorboard, wandb, comet and comms_logger
// (the Python API: python/tessera/monitor/, comms_logger.py).
#include "engine/config/config_support.h"

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace tessera {

using nlohmann::json;
using Severity = ConfigIssue::Severity;

namespace {

constexpr Severity kError = Severity::Error;
constexpr Severity kWarning = Severity::Warning;

const char* const kStage = "zero_optimization.stage";

// Errors first: a warning folds into the error that covers it, so errors are decided first.
const std::vector<UnimplementedKey> kRows = {
    // ---- errors: ignoring these would change the result
    {"aio.use_gds", kError, "[false]", "GPUDirect Storage is not implemented: transfers go through host buffers", {}},
    {"checkpoint.use_node_local_storage", kError, "[false]",
     "a checkpoint is read by whichever rank owns each range now, so every rank's files must be on storage all ranks "
     "share", {}},

    // ---- warnings: not read, but the training is the same without them
    {"zero_optimization.stage3_model_persistence_threshold", kWarning, "",
     "the engine keeps small parameters whole by stage3_param_persistence_threshold alone, without a total cap", {}},
    {"zero_optimization.offload_optimizer.fast_init", kWarning, "",
     "fp32 states start from zeros in memory without being written first anyway; a mixed-precision master is written "
     "once at start", {}},
    {"zero_optimization.offload_param.pin_memory", kWarning, "",
     "the shards offload_param \"cpu\" puts in host memory are the host optimizer's copy and are pinned by "
     "offload_optimizer.pin_memory (GPU ranks; CPU ranks need no pinning)", {}},
    {"zero_optimization.offload_param.max_in_cpu", kWarning, "",
     "with NVMe parameter offload every partitioned shard lives in its file; only buffer_count buffers of it are in "
     "memory", {}},
    {"aio.overlap_events", kWarning, "", "the I/O thread always overlaps submission and completion", {}},
    {"optimizer.params.torch_adam", kWarning, "", "the engine runs its own Adam on flat shards", {}},
};

const json* at_path(const json& j, const std::string& path) {
  const json* node = &j;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

// Defaults for this config: what DeepSpeed would use for every key the user left out, including
// the defaults that depend on other keys (overlap_comm) and the optimizer params of its type.
json reference_of(const Config& c) {
  Config ref;
  if (c.optimizer) {
    ref.optimizer.emplace();
    ref.optimizer->type = c.optimizer->type;  // params' defaults depend on the type
    ref.optimizer->client = c.optimizer->client;
  }
  if (c.zero_optimization.overlap_comm) ref.zero_optimization.overlap_comm = c.zero_optimization.stage == 3;
  json j = config_to_json(ref);
  if (c.optimizer) j["optimizer"]["type"] = nullptr;  // the type has no default: only acted_on counts
  return j;
}

bool is_pattern(const std::string& path) { return !path.empty() && path.back() == '*'; }

struct Finding {
  const UnimplementedKey* row;
  std::string path;
  json value;
};

// Every key of the config that its row says the engine does not act on, in table order.
std::vector<Finding> findings_of(const Config& c) {
  const json actual = config_to_json(c);
  const json reference = reference_of(c);
  std::set<std::string> own_rows;
  for (const auto& row : kRows)
    if (!is_pattern(row.path)) own_rows.insert(row.path);

  std::vector<Finding> out;
  for (const auto& row : kRows) {
    const std::string path = row.path;
    if (!is_pattern(path)) {
      const json* value = at_path(actual, path);
      if (!value) continue;  // a section the config does not have (an optimizer of another type)
      const json* default_value = at_path(reference, path);
      if (default_value && *value == *default_value) continue;
      if (*row.acted_on) {
        json acted = json::parse(row.acted_on);
        if (std::find(acted.begin(), acted.end(), *value) != acted.end()) continue;
      }
      out.push_back({&row, path, *value});
      continue;
    }
    // "section.prefix*": every key of the section starting with prefix, and all keys below it.
    size_t dot = path.rfind('.');
    const std::string section = path.substr(0, dot), prefix = path.substr(dot + 1, path.size() - dot - 2);
    const json* node = at_path(actual, section);
    if (!node || !node->is_object()) continue;
    std::function<void(const json&, const std::string&, bool)> walk = [&](const json& n, const std::string& at,
                                                                          bool top) {
      for (const auto& item : n.items()) {
        if (top && item.key().compare(0, prefix.size(), prefix) != 0) continue;
        const std::string key_path = at + "." + item.key();
        if (own_rows.count(key_path)) continue;
        if (item.value().is_object()) {
          walk(item.value(), key_path, false);
          continue;
        }
        const json* default_value = at_path(reference, key_path);
        if (default_value && item.value() == *default_value) continue;
        out.push_back({&row, key_path, item.value()});
      }
    };
    walk(*node, section, true);
  }
  return out;
}

// `prior`: the config's own errors, when given; a key (or section) already in error there is not
// reported again, nor are the warnings its row would fold into it.
std::vector<ConfigIssue> issues_of(const Config& c, const ConfigReport* prior) {
  auto already = [&](const std::string& path) { return prior && has_error_at(*prior, path); };
  std::vector<ConfigIssue> issues;
  if (!c.optimizer && !already("optimizer"))
    issues.push_back({kError, "optimizer",
                      "missing; the engine builds the optimizer from this section (from Python, "
                      "tessera.initialize(optimizer=...) stands for it: a torch.optim Adam, AdamW or SGD becomes this section, and "
                      "any other torch optimizer runs as given over the flat shards)"});

  std::vector<Finding> findings = findings_of(c);
  std::map<std::string, std::vector<std::string>> folded;  // error path -> the keys it covers
  std::set<std::string> fired;                           // error rows that are reported
  for (const auto& f : findings)
    if (f.row->severity == kError && !already(f.path)) fired.insert(f.path);
  for (const auto& f : findings) {
    if (f.row->severity != kWarning) continue;
    for (const char* cover : f.row->covered_by) {
      if (!cover) continue;
      if (fired.count(cover)) {
        folded[cover].push_back(f.path);
        break;
      }
    }
  }
  for (const auto& f : findings) {
    if (already(f.path)) continue;
    bool covered = false;
    for (const char* cover : f.row->covered_by)
      if (cover && (fired.count(cover) || already(cover))) covered = true;
    if (covered) continue;
    std::string message = "not implemented yet: found " + f.value.dump() + "; " + f.row->note;
    if (f.row->severity == kError && folded.count(f.path)) {
      message += " (the keys that come with it are not read either: ";
      const auto& keys = folded[f.path];
      for (size_t i = 0; i < keys.size(); ++i) message += (i ? ", " : "") + keys[i];
      message += ")";
    }
    issues.push_back({f.row->severity, f.path, message});
  }
  return issues;
}

}  // namespace

const std::vector<UnimplementedKey>& unimplemented_keys() { return kRows; }

std::vector<ConfigIssue> engine_support_issues(const Config& config) { return issues_of(config, nullptr); }

void add_engine_support_issues(const Config& config, ConfigReport& report) {
  for (auto& issue : issues_of(config, &report)) report.issues.push_back(std::move(issue));
}

}  // namespace tessera
