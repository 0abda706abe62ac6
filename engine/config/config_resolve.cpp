// What the config means once the world size is known: parallel degrees, the batch triple, and
// the contradictions between keys that no single key's rule can see.
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "engine/config/config_io.h"
#include "engine/config/elasticity.h"
#include "parallel/topology.h"

namespace tessera {

namespace {

std::string s(int64_t x) { return std::to_string(x); }

// DeepSpeed's elasticity: the batch triple comes from the elastic layout for this data-parallel
// size (engine/config/elasticity.h). Batch keys given beside it are an error unless
// ignore_non_elastic_batch_info says to drop them, as in DeepSpeed.
void apply_elasticity(Config& c, int dp, ConfigReport& report) {
  const ElasticityConfig& e = *c.elasticity;
  if (!e.ignore_non_elastic_batch_info)
    for (const auto& [key, given] : {std::pair<const char*, bool>{"train_batch_size", c.train_batch_size.has_value()},
                                     {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu.has_value()},
                                     {"gradient_accumulation_steps", c.gradient_accumulation_steps.has_value()}})
      if (given)
        report.error(key, std::string(key) + " is set while elasticity.enabled decides the batch for each world size; "
                          "remove it, or set elasticity.ignore_non_elastic_batch_info to true to have it ignored");
  try {
    const ElasticBatch b = compute_elastic_batch(e, dp);
    c.train_batch_size = b.train_batch_size;
    c.train_micro_batch_size_per_gpu = b.micro_batch;
    c.gradient_accumulation_steps = b.gradient_accumulation_steps;
  } catch (const ElasticityError& error) {
    report.error(error.path, error.what());
  }
}

// DeepSpeed's _set_batch_related_parameters, with the arithmetic shown in every error:
// train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel size.
void resolve_batch(Config& c, int dp, ConfigReport& report) {
  auto& tb = c.train_batch_size;
  auto& mb = c.train_micro_batch_size_per_gpu;
  auto& gas = c.gradient_accumulation_steps;
  const std::string dps = "data-parallel size " + s(dp);
  if (tb && mb && gas) {
    if (*tb != *mb * *gas * dp)
      report.error("train_batch_size",
                   "train_batch_size " + s(*tb) + " != train_micro_batch_size_per_gpu " + s(*mb) +
                       " x gradient_accumulation_steps " + s(*gas) + " x " + dps + " (= " + s(*mb * *gas * dp) +
                       "); fix one of them or leave one out to have it derived");
  } else if (tb && mb) {
    if (*tb % (*mb * dp) != 0)
      report.error("train_batch_size", "train_batch_size " + s(*tb) + " is not divisible by train_micro_batch_size_per_gpu " +
                                           s(*mb) + " x " + dps + " (= " + s(*mb * dp) +
                                           "), so gradient_accumulation_steps cannot be derived");
    else
      gas = *tb / (*mb * dp);
  } else if (tb && gas) {
    if (*tb % (*gas * dp) != 0)
      report.error("train_batch_size", "train_batch_size " + s(*tb) + " is not divisible by gradient_accumulation_steps " +
                                           s(*gas) + " x " + dps + " (= " + s(*gas * dp) +
                                           "), so train_micro_batch_size_per_gpu cannot be derived");
    else
      mb = *tb / (*gas * dp);
  } else if (mb && gas) {
    tb = *mb * *gas * dp;
  } else if (tb) {
    if (*tb % dp != 0)
      report.error("train_batch_size", "train_batch_size " + s(*tb) + " is not divisible by the " + dps);
    else
      gas = 1, mb = *tb / dp;
  } else if (mb) {
    gas = 1, tb = *mb * dp;
  } else {
    report.error("train_batch_size",
                 "either train_batch_size or train_micro_batch_size_per_gpu must be set (the third of "
                 "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                 "data-parallel size is derived; \"auto\", Hugging Face's placeholder, counts as unset)");
  }
}

void check_offload(const std::string& path, const std::string& device, const std::string& nvme_path,
                   ConfigReport& report) {
  if (device == "nvme" && nvme_path.empty())
    report.error(path + ".nvme_path", "offload device \"nvme\" needs nvme_path: the directory for swap files");
}

}  // namespace

ResolvedLayout resolve_config(Config& c, int world_size, ConfigReport& report) {
  // A check that involves a key which failed to parse (its field holds a default or a rejected
  // value) is skipped: the key's own error says what is wrong, and a second error about it would
  // be about a value the user did not write.
  const ConfigReport parsed = report;
  auto unparsed = [&parsed](std::initializer_list<std::string> paths) {
    for (const auto& p : paths)
      if (has_error_at(parsed, p)) return true;
    return false;
  };

  ResolvedLayout layout;
  layout.world_size = world_size;
  std::string grid_error;
  // DeepSpeed's sequence_parallel_size is context_parallel.size under another name.
  if (c.sequence_parallel_size && !unparsed({"sequence_parallel_size", "context_parallel.size"})) {
    if (c.context_parallel.size != 1 && c.context_parallel.size != *c.sequence_parallel_size)
      report.error("sequence_parallel_size", "sequence_parallel_size " + s(*c.sequence_parallel_size) +
                                                 " != context_parallel.size " + s(c.context_parallel.size) +
                                                 "; they name the same degree, give one");
    else
      c.context_parallel.size = *c.sequence_parallel_size;
  }
  if (!unparsed({"tensor_parallel.tp_size", "tensor_parallel.autotp_size", "pipeline.stages", "context_parallel.size",
                 "sequence_parallel_size"})) {
    const int tp = c.tensor_parallel.tp_size, pp = c.pipeline.stages, cp = c.context_parallel.size;
    auto grid = make_grid_shape(world_size, tp, pp, &grid_error, cp);
    if (!grid) {
      const bool context_is_why = cp > 1 && tp >= 1 && pp >= 1 && world_size % (tp * pp) == 0;
      report.error(context_is_why ? (c.sequence_parallel_size ? "sequence_parallel_size" : "context_parallel.size")
                                  : "tensor_parallel.tp_size",
                   grid_error);
    } else {
      layout.tensor = grid->tensor, layout.pipe = grid->pipe, layout.data = grid->data, layout.context = grid->context;
      if (c.elasticity && c.elasticity->enabled && !unparsed({"elasticity"}))
        apply_elasticity(c, grid->data, report);
      if (!unparsed({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}))
        resolve_batch(c, grid->data, report);
    }
  }

  if (c.moe && !unparsed({"moe.num_experts", "moe.ep_size", "moe.k"})) {
    const MoeConfig& m = *c.moe;
    if (m.num_experts % m.ep_size != 0)
      report.error("moe.ep_size", "ep_size " + s(m.ep_size) + " does not divide num_experts " + s(m.num_experts) +
                                      ": each of the ep_size ranks holds num_experts / ep_size experts");
    else if (grid_error.empty() && layout.data % m.ep_size != 0)
      report.error("moe.ep_size", "ep_size " + s(m.ep_size) + " does not divide the data-parallel size " +
                                      s(layout.data) + " (world " + s(world_size) + " / tensor " + s(layout.tensor) +
                                      " / pipe " + s(layout.pipe) + "): the expert-parallel group is carved out of "
                                      "the data-parallel ranks");
    if (m.k > m.num_experts)
      report.error("moe.k", "k " + s(m.k) + " exceeds num_experts " + s(m.num_experts));
  }

  // Pipeline micro-batches are the gradient-accumulation steps of one pipeline batch.
  if (c.pipeline.micro_batches && c.gradient_accumulation_steps &&
      *c.pipeline.micro_batches != *c.gradient_accumulation_steps &&
      !unparsed({"pipeline.micro_batches", "gradient_accumulation_steps"}))
    report.error("pipeline.micro_batches", "pipeline.micro_batches " + s(*c.pipeline.micro_batches) +
                                               " != gradient_accumulation_steps " + s(*c.gradient_accumulation_steps) +
                                               "; a pipeline runs one micro-batch per accumulation step");
  if (!c.pipeline.micro_batches) c.pipeline.micro_batches = c.gradient_accumulation_steps;
  // The schedule's own needs (parallel/pipeline/schedule.h): model chunks only for the interleaved
  // schedule, whose micro-batches go through the chunks in groups of pipeline.stages, and for zb_v,
  // whose V is two chunks a stage (virtual_stages resolves to 2 there).
  if (c.pipeline.stages > 1 && !unparsed({"pipeline.schedule", "pipeline.virtual_stages", "pipeline.stages"})) {
    PipelineConfig& pc = c.pipeline;
    if (pc.schedule == "zb_v") {
      if (pc.virtual_stages == 1) pc.virtual_stages = 2;
      if (pc.virtual_stages != 2)
        report.error("pipeline.virtual_stages", "pipeline.schedule \"zb_v\" places 2 model chunks on each stage (a V): "
                                                "pipeline.virtual_stages must be 2 (or left out), got " + s(pc.virtual_stages));
    } else if (pc.virtual_stages > 1 && pc.schedule != "interleaved_1f1b")
      report.error("pipeline.virtual_stages", "pipeline.virtual_stages " + s(pc.virtual_stages) +
                                                  " needs pipeline.schedule \"interleaved_1f1b\" (or 2 with \"zb_v\"), got \"" + pc.schedule + "\"");
    else if (pc.virtual_stages > 1 && pc.micro_batches && *pc.micro_batches % pc.stages != 0)
      report.error("gradient_accumulation_steps", "interleaved_1f1b runs the micro-batches through the model chunks in "
                                                  "groups of pipeline.stages: gradient_accumulation_steps (pipeline.micro_batches) " +
                                                      s(*pc.micro_batches) + " must be a multiple of pipeline.stages " + s(pc.stages));
  }

  auto& z = c.zero_optimization;
  if (!z.overlap_comm) z.overlap_comm = z.stage == 3;  // DeepSpeed's default

  if (c.fp16.enabled && c.bf16.enabled && !unparsed({"fp16.enabled", "bf16.enabled", "bfloat16.enabled"}))
    report.error("bf16.enabled", "fp16.enabled and bf16.enabled are both true; choose one");
  if (c.fp16.enabled && c.fp16.loss_scale == 0 &&
      c.fp16.min_loss_scale > std::ldexp(1.0, c.fp16.initial_scale_power) &&
      !unparsed({"fp16.enabled", "fp16.loss_scale", "fp16.min_loss_scale", "fp16.initial_scale_power"}))
    report.error("fp16.min_loss_scale", "min_loss_scale " + std::to_string(c.fp16.min_loss_scale) +
                                            " is above the initial scale 2^" + s(c.fp16.initial_scale_power));

  const std::string stage = s(z.stage);
  const bool stage_ok = !unparsed({"zero_optimization.stage"});
  if (c.data_types.grad_accum_dtype == "bf16" && !unparsed({"data_types.grad_accum_dtype"})) {
    if (!c.bf16.enabled && !unparsed({"bf16.enabled", "bfloat16.enabled"}))
      report.error("data_types.grad_accum_dtype", "grad_accum_dtype \"bf16\" needs bf16 compute (bf16.enabled true)");
    else if (z.stage > 1 && stage_ok)
      report.error("data_types.grad_accum_dtype", "grad_accum_dtype \"bf16\" applies at ZeRO stage 0 or 1, where "
                                                  "the whole gradient is kept; zero_optimization.stage is " + stage);
  }
  if (z.offload_param.device != "none" && z.stage != 3 && stage_ok &&
      !unparsed({"zero_optimization.offload_param.device"}))
    report.error("zero_optimization.offload_param.device",
                 "offload_param needs ZeRO stage 3 (parameters are partitioned only there); "
                 "zero_optimization.stage is " + stage);
  if (z.offload_optimizer.device != "none" && z.stage == 0 && stage_ok &&
      !unparsed({"zero_optimization.offload_optimizer.device"}))
    report.error("zero_optimization.offload_optimizer.device",
                 "offload_optimizer needs ZeRO stage 1, 2 or 3 (it offloads the partitioned optimizer states); "
                 "zero_optimization.stage is 0");
  if (z.offload_optimizer.ratio < 1.0 && z.stage != 3 && stage_ok &&
      !unparsed({"zero_optimization.offload_optimizer.ratio"}))
    report.error("zero_optimization.offload_optimizer.ratio", "a partial offload ratio needs ZeRO stage 3");
  // DeepSpeed's ratio splits the optimizer step between the device and the CPU (ZeRO-Offload++);
  // it has no meaning for NVMe, where DeepSpeed fails too.
  if (z.offload_optimizer.ratio < 1.0 && z.offload_optimizer.device != "cpu" &&
      !unparsed({"zero_optimization.offload_optimizer.ratio", "zero_optimization.offload_optimizer.device"}))
    report.error("zero_optimization.offload_optimizer.ratio",
                 "a partial offload ratio splits the optimizer step between the device and the CPU: it needs "
                 "offload_optimizer.device \"cpu\" (found \"" + z.offload_optimizer.device + "\")");
  for (const char* section : {"zero_optimization.offload_optimizer", "zero_optimization.offload_param"}) {
    const std::string path = section;
    const bool optimizer = path == "zero_optimization.offload_optimizer";
    if (!unparsed({path + ".device", path + ".nvme_path"}))
      check_offload(path, optimizer ? z.offload_optimizer.device : z.offload_param.device,
                    optimizer ? z.offload_optimizer.nvme_path : z.offload_param.nvme_path, report);
  }

  // A script's own torch optimizer (tessera.initialize(optimizer=...) of a kind the engine lacks) runs
  // over each rank's flat fp32 shard. Under ZeRO that is DeepSpeed's "untested optimizer": its
  // consent key is needed, as there. NVMe offload streams state the client optimizer owns: refused.
  if (c.optimizer && c.optimizer->client) {
    const std::string& type = c.optimizer->type;
    if (z.stage > 0 && stage_ok && !c.zero_allow_untested_optimizer && !unparsed({"zero_allow_untested_optimizer"}))
      report.error("zero_allow_untested_optimizer",
                   "optimizer=" + type + " is not one of the optimizers tessera implements (a torch.optim Adam, "
                   "AdamW or SGD maps onto the engine's own; Lamb and the 1-bit family are the config's "
                   "optimizer.type); at ZeRO stage " + stage + " the engine can run it as given over each rank's "
                   "flat fp32 shard, untested: set \"zero_allow_untested_optimizer\": true to do that (DeepSpeed's "
                   "rule), or use stage 0, or one of those optimizers");
    for (const auto& [key, device] : {std::pair<std::string, std::string>{"offload_optimizer", z.offload_optimizer.device},
                                      {"offload_param", z.offload_param.device}})
      if (device == "nvme" && !unparsed({"zero_optimization." + key + ".device"}))
        report.error("zero_optimization." + key + ".device",
                     "\"nvme\" streams the shards through files, while optimizer=" + type + " (a client torch "
                     "optimizer) steps them where they are in memory; expected \"cpu\" or \"none\"");
  }

  if (c.scheduler) {
    const auto& p = c.scheduler->params;
    const std::string& type = c.scheduler->type;
    const bool warmup_decay = type == "WarmupDecayLR" || type == "WarmupCosineLR";
    if (warmup_decay && !p.total_num_steps && !unparsed({"scheduler.params.total_num_steps"}))
      report.error("scheduler.params.total_num_steps", type + " needs total_num_steps");
    if (warmup_decay && p.total_num_steps && *p.total_num_steps < p.warmup_num_steps &&
        !unparsed({"scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps"}))
      report.error("scheduler.params.total_num_steps", "total_num_steps " + s(*p.total_num_steps) +
                                                           " is below warmup_num_steps " + s(p.warmup_num_steps));
    if ((type == "WarmupLR" || type == "WarmupDecayLR") && p.warmup_min_lr > p.warmup_max_lr &&
        !unparsed({"scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr"}))
      report.error("scheduler.params.warmup_min_lr", "warmup_min_lr is above warmup_max_lr");
    if (type == "OneCycle") {
      const bool min_ok = !unparsed({"scheduler.params.cycle_min_lr"});
      const bool max_ok = !unparsed({"scheduler.params.cycle_max_lr"});
      if (!p.cycle_min_lr && min_ok) report.error("scheduler.params.cycle_min_lr", "OneCycle needs cycle_min_lr");
      if (!p.cycle_max_lr && max_ok) report.error("scheduler.params.cycle_max_lr", "OneCycle needs cycle_max_lr");
      if (p.cycle_min_lr && p.cycle_max_lr && *p.cycle_min_lr > *p.cycle_max_lr && min_ok && max_ok)
        report.error("scheduler.params.cycle_min_lr", "cycle_min_lr is above cycle_max_lr");
    }
  }
  return layout;
}

}  // namespace tessera
