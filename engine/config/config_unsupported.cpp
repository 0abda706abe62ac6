// The table of DeepSpeed config keys that tessera knows but does not implement
// (from DeepSpeed's runtime/constants.py and runtime/zero/config.py).
#include "engine/config/config_unsupported.h"

#include <iterator>

namespace tessera {

namespace {
const UnsupportedKey kUnsupported[] = {
    // top level
    {"amp", "use \"bf16\" or \"fp16\""},
    {"flops_profiler", ""},
    {"wandb", "use \"csv_monitor\" or \"tensorboard\""},
    {"comet", "use \"csv_monitor\" or \"tensorboard\""},
    {"sparse_gradients", ""},
    {"fp32_allreduce", ""},
    {"zero_allow_untested_optimizer", "tessera's ZeRO runs every optimizer it supports"},
    {"zero_force_ds_cpu_optimizer", ""},
    {"memory_breakdown", "tessera's progress lines always include peak memory"},
    {"dump_state", ""},
    {"disable_allgather", ""},
    {"elasticity", ""},
    {"autotuning", ""},
    {"data_efficiency", ""},
    {"curriculum_learning", ""},
    {"compression_training", ""},
    {"sparse_attention", ""},
    {"progressive_layer_drop", ""},
    {"eigenvalue", ""},
    {"quantize_training", ""},
    {"hybrid_engine", ""},
    {"nebula", ""},
    {"weight_quantization", ""},
    {"compile", ""},
    {"timers", ""},
    {"graph_harvesting", ""},
    {"use_data_before_expert_parallelism", ""},
    {"seq_parallel_communication_data_type", ""},
    {"dataloader_drop_last", ""},
    {"zero_optimization.cpu_offload", "renamed by DeepSpeed: set zero_optimization.offload_optimizer.device to \"cpu\""},
    {"zero_optimization.cpu_offload_params", "renamed by DeepSpeed: set zero_optimization.offload_param.device to \"cpu\""},
    {"zero_optimization.cpu_offload_use_pin_memory", "renamed by DeepSpeed: use offload_optimizer.pin_memory"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "renamed: use stage3_gather_16bit_weights_on_model_save"},
    {"zero_optimization.elastic_checkpoint", ""},
    {"zero_optimization.legacy_stage1", ""},
    {"zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_weights", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_nontrainable_weights", "ZeRO++ is not implemented"},
    {"zero_optimization.zero_quantized_gradients", "ZeRO++ is not implemented"},
    {"zero_optimization.mics_shard_size", "MiCS is not implemented"},
    {"zero_optimization.mics_hierarchical_params_gather", "MiCS is not implemented"},
    {"zero_optimization.memory_efficient_linear", ""},
    {"zero_optimization.use_multi_rank_bucket_allreduce", "tessera reduce-scatters buckets directly"},
    {"zero_optimization.stage3_module_granularity_threshold", ""},
    {"zero_optimization.use_all_reduce_for_fetch_params", ""},
    {"zero_optimization.pipeline_loading_checkpoint", ""},
    {"zero_optimization.override_module_apply", ""},
    {"zero_optimization.log_trace_cache_warnings", ""},
    {"zero_optimization.zeropp_loco_param", ""},
    {"zero_optimization.offload_optimizer.max_in_cpu", ""},
    {"fp16.auto_cast", ""},
    {"fp16.fp16_master_weights_and_grads", "tessera keeps fp32 master weights"},
    {"bf16.immediate_grad_update", ""},
    {"aio.thread_count", "DeepSpeed ignores it too; use aio.intra_op_parallelism"},
    {"pipeline.partition", "use pipeline.partition_method"},
    {"pipeline.seed_layers", ""},
    {"pipeline.pipe_partitioned", ""},
    {"pipeline.grad_partitioned", ""},
    {"pipeline.use_reentrant", ""},
    {"optimizer.params.max_grad_norm", "use the top-level \"gradient_clipping\""},
    {"optimizer.params.amsgrad", ""},
    {"optimizer.params.fused", ""},
    {"optimizer.params.foreach", ""},
    {"scheduler.params.last_batch_iteration", "tessera restores schedule positions from checkpoints"},
    {"tensor_parallel.tp", "use tensor_parallel.tp_size"},
    {"tensor_parallel.tp_grain_size", ""},
    {"tensor_parallel.tp_overlap_comm", ""},
    {"tensor_parallel.partition_config", ""},
    {"tensor_parallel.injection_policy_tuple", ""},
    {"tensor_parallel.keep_module_on_host", ""},
    {"tensorboard.team", ""},
    {"comms_logger.prof_all_ranks", ""},
    {"checkpoint.writer", ""},
};
}  // namespace

const UnsupportedKey* find_unsupported_key(const std::string& path) {
  for (const auto& k : kUnsupported)
    if (path == k.path) return &k;
  return nullptr;
}

}  // namespace tessera
