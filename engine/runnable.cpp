#include "engine/runnable.h"

#include <cstdio>

#include "csrc/cpu_features.h"
#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "optim/flat_optimizer.h"

namespace tessera {
namespace {

// The 1-bit family (optim/onebit.h) runs at ZeRO stage 0 on the data group's own backend.
void check_onebit(const Config& c, const RunContext& run) {
  const std::string& type = c.optimizer->type;
  const std::string& backend = c.optimizer->params.comm_backend_name;
  if (backend == "mpi" || backend == "hccl")
    throw ConfigError("tessera: optimizer.params.comm_backend_name: \"" + backend + "\" is not available: tessera's "
                      "compressed allreduce runs on the data-parallel group's own backend (" +
                      std::string(run.nccl ? "NCCL on these GPU ranks" : "Gloo on these CPU ranks") +
                      "); expected \"" + (run.nccl ? "nccl" : "gloo") + "\" (or \"compressed\")");
  const int stage = c.zero_optimization.stage;
  if (stage == 0) return;
  // Why not ZeRO: the exchange averages the whole momentum on every rank (whole error buffers
  // too), so only the variance could be partitioned, while the updated parameters would have to be
  // all-gathered every step: far more bytes than the compression saves.
  const int64_t numel = run.parameters;
  const int ranks = run.grid.data;
  const double share = ranks > 1 ? double(ranks - 1) / ranks : 0.5;  // what a rank sends of a gathered buffer
  const double param_bytes = (c.bf16.enabled || c.fp16.enabled) ? 2 : 4;
  const double gather = share * param_bytes * numel, compressed = 2 * share * numel / 8.0;
  char numbers[512];
  std::snprintf(numbers, sizeof(numbers),
                "for this model (%lld parameters on this rank, %d data-parallel ranks) a step would send %.2f MB "
                "for the parameter all-gather plus %.2f MB of compressed momentum, against %.2f MB at stage 0 "
                "(%.1fx the traffic), to partition only the variance (%.2f MB per rank)",
                (long long)numel, ranks, gather / 1e6, compressed / 2e6, compressed / 1e6,
                (gather + compressed / 2) / compressed, 4.0 * numel * share / 1e6);
  throw ConfigError("tessera: optimizer.type " + type + " runs with zero_optimization.stage 0 only (found " +
                    std::to_string(stage) + "). Its compressed exchange averages the whole momentum on every rank, "
                    "so ZeRO would partition little and add an all-gather of the updated parameters each step: " +
                    numbers + ". Use stage 0 with " + type + ", or Adam with ZeRO (docs/onebit.md)");
}

// ZeRO-3's parameter offload on GPU ranks: the shards in host memory or NVMe files, stepped in host
// memory by the host optimizer (ZeroOptions::host_parameters, nvme_parameters).
void check_offload(const Config& c, const RunContext& run, std::vector<std::string>& notes) {
  const bool gpu = !run.device.is_cpu();
  const std::string& offload_param = c.zero_optimization.offload_param.device;
  if (offload_param != "none" && gpu && c.zero_optimization.offload_optimizer.device == "none")
    throw ConfigError("tessera: zero_optimization.offload_param.device: \"" + offload_param + "\" on " +
                      run.device.str() + " needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (the "
                      "optimizer steps the shards in host memory, where they are or where their files are read)");
  if (c.zero_optimization.offload_optimizer.ratio < 1.0 && gpu) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "warning: zero_optimization.offload_optimizer.ratio %g: on GPU ranks the whole optimizer step runs "
                  "on the host (ratio 1); the training is the same, the GPU holds less",
                  c.zero_optimization.offload_optimizer.ratio);
    notes.push_back(line);
  }
}

// What both overlaps of the host step need (the delayed update, super_offload: each steps the host
// copies bucket by bucket on a thread of its own while the GPU computes): the reason `step` cannot
// run here, or nothing. `overlapped` is the GPU's work it overlaps, `reader` what gathers ZeRO-3's shards.
std::string overlapped_step_refusal(const Config& c, const RunContext& run, const std::string& step,
                                    const std::string& overlapped, const std::string& reader) {
  const std::string& param = c.zero_optimization.offload_param.device;
  const std::string& type = c.optimizer->type;
  if (c.zero_optimization.stage == 3 && param != "none")
    return "with zero_optimization.offload_param.device \"" + param + "\": the " + step +
           " would write the shards the " + reader + " gathers meanwhile (not yet)";
  if (run.device.is_cpu() && !run.host_staging)
    return "overlaps the host's optimizer step with the GPU's " + overlapped + "; these ranks run on the CPU, "
           "where both would share the same cores (TESSERA_HOST_STAGING=1 runs the GPU ranks' path here, for tests)";
  if (run.pipeline_stage) return "does not run through pipeline stages yet";
  if (c.optimizer->client || (type != "Adam" && type != "AdamW" && type != "SGD"))
    return "needs optimizer.type Adam, AdamW or SGD (found " + type + "): the " + step +
           " runs bucket by bucket on a thread of its own, without collectives";
  return "";
}

// offload_optimizer.delayed_param_update: the host steps host copies on a thread of its own while
// the GPU runs the next forward and backward (zero/zero_optimizer.h).
void check_delayed_update(const Config& c, const RunContext& run) {
  const auto& offload = c.zero_optimization.offload_optimizer;
  if (!offload.delayed_param_update.enabled) return;
  const std::string why =
      offload.device == "none"
          ? "needs zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\" (the host steps while the GPU trains)"
          : overlapped_step_refusal(c, run, "delayed update", "forward and backward", "forward");
  if (!why.empty())
    throw ConfigError("tessera: zero_optimization.offload_optimizer.delayed_param_update.enabled: true " + why);
}

// offload_optimizer.super_offload: the host steps each bucket's chunk during the backward, on a
// thread of its own, and the step validates it (zero/speculative_step.h).
void check_super_offload(const Config& c, const RunContext& run) {
  const auto& offload = c.zero_optimization.offload_optimizer;
  if (!offload.super_offload) return;
  std::string why;
  if (offload.device != "cpu")
    why = "needs zero_optimization.offload_optimizer.device \"cpu\" (found \"" + offload.device +
          "\"): the speculated chunks are restored from copies in host memory";
  else if (c.zero_optimization.stage == 0)
    why = "needs zero_optimization.stage 1-3 (the step runs bucket by bucket)";
  else if (offload.delayed_param_update.enabled)
    why = "with offload_optimizer.delayed_param_update: choose one (the delayed update already hides the whole step)";
  else
    why = overlapped_step_refusal(c, run, "speculated step", "backward", "backward");
  if (!why.empty()) throw ConfigError("tessera: zero_optimization.offload_optimizer.super_offload: true " + why);
}

}  // namespace

std::vector<std::string> check_runnable(const Config& c, const RunContext& run) {
  std::vector<std::string> notes;
  if (!run.pipeline_stage && run.grid.pipe > 1)
    throw ConfigError("tessera: pipeline.stages is " + std::to_string(run.grid.pipe) +
                      ": a model cut into stages trains through tessera::PipelineEngine (engine/pipeline_engine.h, "
                      "C++ only so far; docs/pipeline.md); the Engine alone trains a whole model");
  // Keys the engine does not act on yet (engine/config/config_support.h): errors refuse the
  // config, the rest are named once.
  std::string refused, ignored;
  for (const ConfigIssue& issue : engine_support_issues(c))
    (issue.severity == ConfigIssue::Severity::Error ? refused : ignored) += "  " + issue.str() + "\n";
  if (!refused.empty()) throw ConfigError("tessera: the engine cannot run this config:\n" + refused);
  if (!ignored.empty()) notes.push_back("config keys the engine ignores:\n" + ignored.substr(0, ignored.size() - 1));
  check_offload(c, run, notes);
  check_delayed_update(c, run);
  check_super_offload(c, run);
  if (c.optimizer && is_onebit_optimizer(c.optimizer->type)) check_onebit(c, run);
  // The model applies tensor parallelism (parallel/tensor_parallel/); one that marked no slice
  // trains a whole copy on every tensor rank: correct, but nothing is split.
  if (run.grid.tensor > 1 && !run.tensor_sliced)
    notes.push_back("warning: tensor_parallel.tp_size is " + std::to_string(run.grid.tensor) +
                    " but no parameter is marked tensor-sharded (ParamGroup::tensor_splits): every tensor rank "
                    "trains a whole copy of the model");
  // bf16 on a CPU without bf16 arithmetic: every matmul converts through fp32, ~11x slower.
  if (c.bf16.enabled && run.device.is_cpu() && !cpu_has_fast_bf16())
    notes.push_back("note: bf16 is enabled but this CPU has " + cpu_bf16_missing() +
                    ": PyTorch emulates bf16 matmuls through fp32, about 11x slower than fp32 here. Disable bf16 on "
                    "this machine for speed (fp32 uses more memory for parameters and activations).");
  return notes;
}

}  // namespace tessera
