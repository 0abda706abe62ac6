// The table of DeepSpeed config keys that tessera knows but does not implement
// (from DeepSpeed's runtime/constants.py and runtime/zero/config.py).
#include "engine/config/config_unsupported.h"

#include <cstring>
#include <iterator>

namespace tessera {

namespace {
const UnsupportedKey kUnsupported[] = {
    // path, hint, DeepSpeed's default (JSON; kDisabledSection: "enabled": false), out of scope
    {"amp", "use \"bf16\" or \"fp16\"", kDisabledSection, nullptr},
    {"sparse_gradients", "", "false", nullptr},
    {"fp32_allreduce", "", "false", nullptr},
    {"zero_force_ds_cpu_optimizer", "", "true", nullptr},
    {"dump_state", "", "false", nullptr},
    {"disable_allgather", "", "false", nullptr},
    {"autotuning", "", kDisabledSection, "autotuner (autotuning)"},
    {"data_efficiency", "", kDisabledSection, "data efficiency library (data_efficiency: data sampling, routing)"},
    {"curriculum_learning", "", kDisabledSection, "curriculum learning (curriculum_learning)"},
    {"compression_training", "", "{}", "compression library (compression_training: quantization, pruning, layer reduction)"},
    {"sparse_attention", "", nullptr, "sparse attention kernels (sparse_attention)"},
    {"progressive_layer_drop", "", kDisabledSection, "progressive layer drop (progressive_layer_drop)"},
    {"eigenvalue", "", kDisabledSection, "eigenvalue computation (eigenvalue)"},
    {"quantize_training", "", kDisabledSection, "quantization-aware training (quantize_training)"},
    {"hybrid_engine", "", kDisabledSection, "hybrid engine for RLHF (hybrid_engine)"},
    {"nebula", "", kDisabledSection, nullptr},
    {"weight_quantization", "", nullptr, "weight quantization (weight_quantization)"},
    {"compile", "", nullptr, nullptr},
    {"timers", "", nullptr, nullptr},
    {"graph_harvesting", "", "false", nullptr},
    {"use_data_before_expert_parallelism", "", "false", nullptr},
    {"seq_parallel_communication_data_type", "", "\"fp32\"", nullptr},
    {"dataloader_drop_last", "", "false", nullptr},
    {"zero_optimization.cpu_offload", "renamed by DeepSpeed: set zero_optimization.offload_optimizer.device to \"cpu\"", "false", nullptr},
    {"zero_optimization.cpu_offload_params", "renamed by DeepSpeed: set zero_optimization.offload_param.device to \"cpu\"", "false", nullptr},
    {"zero_optimization.cpu_offload_use_pin_memory", "renamed by DeepSpeed: use offload_optimizer.pin_memory", "false", nullptr},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "renamed: use stage3_gather_16bit_weights_on_model_save", "false", nullptr},
    {"zero_optimization.elastic_checkpoint", "", "false", nullptr},
    {"zero_optimization.legacy_stage1", "", "false", nullptr},
    {"zero_optimization.zero_hpz_partition_size", "ZeRO++ is not implemented", "1", nullptr},
    {"zero_optimization.zero_quantized_weights", "ZeRO++ is not implemented", "false", nullptr},
    {"zero_optimization.zero_quantized_nontrainable_weights", "ZeRO++ is not implemented", "false", nullptr},
    {"zero_optimization.zero_quantized_gradients", "ZeRO++ is not implemented", "false", nullptr},
    {"zero_optimization.mics_shard_size", "MiCS is not implemented", "-1", nullptr},
    {"zero_optimization.mics_hierarchical_params_gather", "MiCS is not implemented", "false", nullptr},
    {"zero_optimization.memory_efficient_linear", "", "true", nullptr},
    {"zero_optimization.use_multi_rank_bucket_allreduce", "tessera reduce-scatters buckets directly", "true", nullptr},
    {"zero_optimization.stage3_module_granularity_threshold", "", "0", nullptr},
    {"zero_optimization.use_all_reduce_for_fetch_params", "", "false", nullptr},
    {"zero_optimization.pipeline_loading_checkpoint", "", "false", nullptr},
    {"zero_optimization.override_module_apply", "", "true", nullptr},
    {"zero_optimization.log_trace_cache_warnings", "", "false", nullptr},
    {"zero_optimization.zeropp_loco_param", "", "null", nullptr},
    {"zero_optimization.offload_optimizer.max_in_cpu", "", nullptr, nullptr},
    {"fp16.fp16_master_weights_and_grads", "tessera keeps fp32 master weights", "false", nullptr},
    {"bf16.immediate_grad_update", "", nullptr, nullptr},
    {"aio.thread_count", "DeepSpeed ignores it too; use aio.intra_op_parallelism", "1", nullptr},
    {"pipeline.partition", "use pipeline.partition_method", "\"best\"", nullptr},
    {"pipeline.seed_layers", "", "false", nullptr},
    {"pipeline.pipe_partitioned", "", "true", nullptr},
    {"pipeline.grad_partitioned", "", "true", nullptr},
    {"pipeline.use_reentrant", "", "true", nullptr},
    {"optimizer.params.max_grad_norm", "use the top-level \"gradient_clipping\"", "0", nullptr},
    {"optimizer.params.amsgrad", "", "false", nullptr},
    {"optimizer.params.fused", "", nullptr, nullptr},
    {"optimizer.params.foreach", "", nullptr, nullptr},
    {"scheduler.params.last_batch_iteration", "tessera restores schedule positions from checkpoints", "-1", nullptr},
    {"tensor_parallel.tp", "use tensor_parallel.tp_size", nullptr, nullptr},
    {"tensor_parallel.tp_grain_size", "", nullptr, nullptr},
    {"tensor_parallel.tp_overlap_comm", "", "false", nullptr},
    {"tensor_parallel.partition_config", "", "null", nullptr},
    {"tensor_parallel.injection_policy_tuple", "", "null", nullptr},
    {"tensor_parallel.keep_module_on_host", "", "false", nullptr},
    {"tensorboard.team", "", nullptr, nullptr},
    {"comms_logger.prof_all_ranks", "", "false", nullptr},
    {"checkpoint.writer", "", "null", nullptr},
};
}  // namespace

bool is_deepspeed_default(const UnsupportedKey& key, const nlohmann::json& value) {
  if (!key.deepspeed_default) return false;
  if (std::strcmp(key.deepspeed_default, kDisabledSection) == 0) {  // any section DeepSpeed leaves disabled
    if (!value.is_object()) return false;
    auto enabled = value.find("enabled");
    return enabled == value.end() || *enabled == false;
  }
  return value == nlohmann::json::parse(key.deepspeed_default);
}

const UnsupportedKey* find_unsupported_key(const std::string& path) {
  for (const auto& k : kUnsupported)
    if (path == k.path) return &k;
  return nullptr;
}

}  // namespace tessera
