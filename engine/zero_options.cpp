// What ZeRO takes from the config (engine/zero_options.h).
#include "engine/zero_options.h"

#include <stdexcept>
#include <string>

namespace tessera {

namespace {

// The aio section, for both kinds of NVMe offload.
AioOptions aio_options(const Config& c) {
  AioOptions aio;
  aio.block_size = c.aio.block_size;
  aio.queue_depth = c.aio.queue_depth;
  aio.intra_op_parallelism = c.aio.intra_op_parallelism;
  aio.single_submit = c.aio.single_submit;
  return aio;
}

}  // namespace

ZeroOptions zero_options_from_config(const Config& c, int rank, int data_size, const EngineEnvironment& env) {
  ZeroOptions o;
  o.stage = c.zero_optimization.stage;
  o.overlap_allgather = c.zero_optimization.overlap_comm.value_or(false);
  o.reduce_scatter = c.zero_optimization.reduce_scatter;
  o.gradient_dtype = c.data_types.grad_accum_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const std::string wire = c.communication_data_type.value_or(c.data_types.grad_accum_dtype);
  o.communication_dtype = wire == "bf16" ? at::kBFloat16 : wire == "fp16" ? at::kHalf : at::kFloat;
  o.reduce_bucket_numel = c.zero_optimization.reduce_bucket_size;
  o.predivide_factor = c.prescale_gradients ? double(data_size) : c.gradient_predivide_factor;
  o.ignore_unused_parameters = c.zero_optimization.ignore_unused_parameters;
  o.compute_dtype = c.bf16.enabled ? at::kBFloat16 : c.fp16.enabled ? at::kHalf : at::kFloat;
  o.optimizer = c.optimizer->type;
  o.hyper = c.optimizer->params;
  const auto& z = c.zero_optimization;
  o.persistence_threshold = z.stage3_param_persistence_threshold;
  o.partitioned.prefetch_numel = z.stage3_prefetch_bucket_size;
  o.partitioned.max_live_numel = z.stage3_max_live_parameters;
  o.partitioned.max_reuse_distance = z.stage3_max_reuse_distance;
  o.host_optimizer = z.offload_optimizer.device == "cpu" || z.offload_optimizer.device == "nvme";
  o.host_staging_on_cpu = env.host_staging_on_cpu;
  o.host_parameters = z.offload_param.device == "cpu";
  o.host_pinned = z.offload_optimizer.pin_memory;
  if (z.offload_optimizer.delayed_param_update.enabled)
    o.delayed_update_after = z.offload_optimizer.delayed_param_update.warmup_steps;
  o.speculative_step = z.offload_optimizer.super_offload;
  o.speculation_threads_share = z.offload_optimizer.cpuadam_cores_perc;
  if (!env.speculation_fault.empty()) {
    const std::string& f = env.speculation_fault;
    if (f != "early" && f != "unchecked" && f != "unrestored")
      throw std::invalid_argument("tessera: TESSERA_TEST_SPECULATION_FAULT is '" + f +
                                  "'; expected early, unchecked or unrestored");
    o.speculation_fault = f == "early" ? SpeculationFault::Early
                          : f == "unchecked" ? SpeculationFault::Unchecked : SpeculationFault::Unrestored;
  }
  if (z.offload_optimizer.device == "nvme") {
    OptimizerSwapOptions nvme;
    nvme.path = z.offload_optimizer.nvme_path;
    nvme.tile_numel = z.sub_group_size;
    nvme.buffer_count = z.offload_optimizer.buffer_count;
    nvme.pipeline_read = z.offload_optimizer.pipeline_read;
    nvme.pipeline_write = z.offload_optimizer.pipeline_write;
    nvme.aio = aio_options(c);
    nvme.rank = rank;
    o.nvme_optimizer = nvme;
  }
  if (z.offload_param.device == "nvme") {
    ParameterSwapOptions nvme;
    nvme.path = z.offload_param.nvme_path;
    nvme.buffer_count = z.offload_param.buffer_count;
    nvme.buffer_numel = z.offload_param.buffer_size;
    nvme.aio = aio_options(c);
    nvme.rank = rank;
    o.nvme_parameters = nvme;
  }
  return o;
}

}  // namespace tessera
