// The typed, DeepSpeed-compatible training config.
//
// Every default lives here, as a member initializer, and nowhere else; the sections optim/ consumes
// keep their plain data (and defaults) in optim/options.h, which their structs here derive from.
// Each struct lists its JSON keys once, in `fields(v)`: the same list drives parsing (engine/config/config_io.cpp), the
// printing of the effective config, and the "did you mean" suggestions for unknown keys.
// Key names and defaults follow DeepSpeed (runtime/constants.py, runtime/zero/config.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config_rules.h"
#include "engine/config/monitor_config.h"
#include "engine/config/parallel_config.h"
#include "optim/options.h"
#include "zero/options.h"

namespace tessera {

struct Fp16Config : LossScaleParams {
  // DeepSpeed's fp16.auto_cast: the forward's floating-point inputs are cast to fp16 (the Python
  // engine's __call__; a C++ model casts its own inputs).
  bool auto_cast = false;
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("auto_cast", auto_cast);
    v("loss_scale", loss_scale, at_least(0.0));
    v("initial_scale_power", initial_scale_power, in_range(0, 127));
    v("loss_scale_window", loss_scale_window, at_least<int64_t>(1));
    v("hysteresis", hysteresis, at_least(1));
    v("consecutive_hysteresis", consecutive_hysteresis);
    v("min_loss_scale", min_loss_scale, greater_than(0.0));
  }
};

struct Bf16Config {
  bool enabled = false;
  template <class V> void fields(V& v) { v("enabled", enabled); }
};

// Optimizer hyper-parameters; which keys are valid depends on the optimizer type.
struct OptimizerParams : OptimizerHyperparams {
  std::string kind;  // the canonical optimizer type, set by OptimizerConfig before visiting
  // The 1-bit family: DeepSpeed's MPI backend's switch (whether MPI takes device buffers), and
  // which backend carries the compressed collective (the engine checks it against the data group's).
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";

  template <class V> void fields(V& v) {
    v("lr", lr, at_least(0.0));
    if (kind == "client") return;  // a client torch optimizer keeps its settings in its param groups
    if (kind == "SGD") {
      v("momentum", momentum, at_least(0.0));
      v("dampening", dampening, at_least(0.0));
      v("weight_decay", weight_decay, at_least(0.0));
      v("nesterov", nesterov);
      return;
    }
    v("betas", betas, pair_in_unit_interval());
    v("eps", eps, greater_than(0.0));
    v("weight_decay", weight_decay, at_least(0.0));
    v("bias_correction", bias_correction);
    if (kind == "Adam" || kind == "AdamW") {
      v("adam_w_mode", adam_w_mode);
      v("torch_adam", torch_adam);
    } else if (kind == "Lamb") {
      v("max_coeff", max_coeff, greater_than(0.0));
      v("min_coeff", min_coeff, at_least(0.0));
    } else if (kind == "OneBitAdam" || kind == "ZeroOneAdam" || kind == "OneBitLamb") {
      v("cuda_aware", cuda_aware);
      v("comm_backend_name", comm_backend_name, one_of({"nccl", "gloo", "mpi", "compressed", "hccl"}));
      // A frozen variance must have seen at least one gradient (0 would divide by ε alone).
      if (kind == "ZeroOneAdam") {
        v("var_freeze_step", var_freeze_step, at_least<int64_t>(1));
        v("var_update_scaler", var_update_scaler, at_least<int64_t>(1));
        v("local_step_scaler", local_step_scaler, at_least<int64_t>(1));
        v("local_step_clipper", local_step_clipper, at_least<int64_t>(1));
      } else {
        v("freeze_step", freeze_step, at_least<int64_t>(1));
      }
      if (kind == "OneBitLamb") {
        v("max_coeff", max_coeff, greater_than(0.0));
        v("min_coeff", min_coeff, at_least(0.0));
        v("coeff_beta", coeff_beta, in_range(0.0, 1.0));
        v("factor_max", factor_max, greater_than(0.0));
        v("factor_min", factor_min, greater_than(0.0));
        v("factor_threshold", factor_threshold, in_range(0.0, 1.0));
      }
    }
  }
};

struct OptimizerConfig {
  std::string type;
  OptimizerParams params;
  // Not a JSON key: the optimizer is a script's own torch optimizer (ParseOptions::client_optimizer),
  // `type` its class ("torch.optim.Adagrad") and params.lr its first group's learning rate.
  bool client = false;
  template <class V> void fields(V& v) {
    v("type", type, one_of({"Adam", "AdamW", "SGD", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"}));
    params.kind = client ? "client" : type;
    if (type == "AdamW") params.adam_w_mode = true;
    v("params", params);
  }
};

// Learning-rate schedule parameters (DeepSpeed runtime/lr_schedules.py), by schedule type.
struct SchedulerParams : LrScheduleParams {
  std::string kind;

  template <class V> void fields(V& v) {
    if (kind == "OneCycle") {
      v("cycle_min_lr", cycle_min_lr, at_least(0.0));
      v("cycle_max_lr", cycle_max_lr, at_least(0.0));
      v("decay_lr_rate", decay_lr_rate, at_least(0.0));
      v("cycle_first_step_size", cycle_first_step_size, at_least<int64_t>(1));
      v("cycle_second_step_size", cycle_second_step_size, at_least<int64_t>(1));
      v("cycle_first_stair_count", cycle_first_stair_count, at_least<int64_t>(0));
      v("cycle_second_stair_count", cycle_second_stair_count, at_least<int64_t>(0));
      v("decay_step_size", decay_step_size, at_least<int64_t>(0));
      v("cycle_momentum", cycle_momentum);
      v("cycle_min_mom", cycle_min_mom, at_least(0.0));
      v("cycle_max_mom", cycle_max_mom, at_least(0.0));
      v("decay_mom_rate", decay_mom_rate, at_least(0.0));
      return;
    }
    if (kind == "WarmupCosineLR") {
      v("total_num_steps", total_num_steps, at_least<int64_t>(1));
      v("warmup_min_ratio", warmup_min_ratio, in_range(0.0, 1.0));
      v("cos_min_ratio", cos_min_ratio, in_range(0.0, 1.0));
    } else {
      v("warmup_min_lr", warmup_min_lr, at_least(0.0));
      v("warmup_max_lr", warmup_max_lr, at_least(0.0));
      if (kind == "WarmupDecayLR") v("total_num_steps", total_num_steps, at_least<int64_t>(1));
    }
    v("warmup_num_steps", warmup_num_steps, at_least<int64_t>(0));
    v("warmup_type", warmup_type, one_of({"log", "linear"}));
  }
};

struct SchedulerConfig {
  std::string type;
  SchedulerParams params;
  template <class V> void fields(V& v) {
    v("type", type, one_of({"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"}));
    params.kind = type;
    v("params", params);
  }
};

// tessera's offload_optimizer.delayed_param_update (ZeRO-Offload's DPU, Ren et al. 2021 §5): after
// warmup_steps applied steps, each step's host update runs while the next forward and backward
// go on, which therefore use the parameters from one step earlier (docs/offload.md).
struct DelayedParamUpdateConfig {
  bool enabled = false;
  int64_t warmup_steps = 40;  // the paper's "few dozen" synchronous steps first
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("warmup_steps", warmup_steps, at_least<int64_t>(0));
  }
};

struct OffloadOptimizerConfig {
  std::string device = "none";
  std::string nvme_path;
  int buffer_count = kOptimizerSwapBufferCount;
  bool pin_memory = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
  DelayedParamUpdateConfig delayed_param_update;
  // DeepSpeed's SuperOffload switch: the host's step of each bucket overlapped with the backward,
  // speculated and validated at the step so that it stays exact (zero/speculative_step.h).
  bool super_offload = false;
  // With super_offload: the share of the rank's threads (OMP_NUM_THREADS) the speculated step's
  // thread uses, leaving the rest to the thread that drives the GPU (DeepSpeed's key and default).
  double cpuadam_cores_perc = 0.8;
  template <class V> void fields(V& v) {
    v("device", device, one_of({"none", "cpu", "nvme"}));
    v("nvme_path", nvme_path);
    v("buffer_count", buffer_count, at_least(1));
    v("pin_memory", pin_memory);
    v("pipeline_read", pipeline_read);
    v("pipeline_write", pipeline_write);
    v("fast_init", fast_init);
    v("ratio", ratio, in_range(0.0, 1.0));
    v("delayed_param_update", delayed_param_update);
    v("super_offload", super_offload);
    v("cpuadam_cores_perc", cpuadam_cores_perc, in_range(0.0, 1.0));
  }
};

struct OffloadParamConfig {
  std::string device = "none";
  std::string nvme_path;
  int buffer_count = kParameterSwapBufferCount;
  int64_t buffer_size = kParameterSwapBufferNumel;
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = false;
  template <class V> void fields(V& v) {
    v("device", device, one_of({"none", "cpu", "nvme"}));
    v("nvme_path", nvme_path);
    v("buffer_count", buffer_count, at_least(1));
    v("buffer_size", buffer_size, at_least<int64_t>(1));
    v("max_in_cpu", max_in_cpu, at_least<int64_t>(0));
    v("pin_memory", pin_memory);
  }
};

// The sizes (buckets, tiles, ZeRO-3's bounds) and their defaults are zero/options.h's.
struct ZeroConfig : ZeroSizeParams {
  int stage = 0;
  bool contiguous_gradients = true;
  std::optional<bool> overlap_comm;  // resolved: true for stage 3, false otherwise (DeepSpeed)
  bool reduce_scatter = true;
  bool allgather_partitions = true;
  bool load_from_fp32_weights = true;
  bool round_robin_gradients = false;
  bool ignore_unused_parameters = true;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  bool stage3_gather_16bit_weights_on_model_save = false;

  template <class V> void fields(V& v) {
    v("stage", stage, in_range(0, 3));
    v("contiguous_gradients", contiguous_gradients);
    v("overlap_comm", overlap_comm);
    v("reduce_scatter", reduce_scatter);
    v("reduce_bucket_size", reduce_bucket_size, at_least<int64_t>(1));
    v("allgather_partitions", allgather_partitions);
    v("allgather_bucket_size", allgather_bucket_size, at_least<int64_t>(1));
    v("load_from_fp32_weights", load_from_fp32_weights);
    v("round_robin_gradients", round_robin_gradients);
    v("ignore_unused_parameters", ignore_unused_parameters);
    v("offload_optimizer", offload_optimizer);
    v("offload_param", offload_param);
    v("sub_group_size", sub_group_size, at_least<int64_t>(1));
    v("stage3_prefetch_bucket_size", stage3_prefetch_bucket_size, at_least<int64_t>(0));
    v("stage3_param_persistence_threshold", stage3_param_persistence_threshold, at_least<int64_t>(0));
    v("stage3_model_persistence_threshold", stage3_model_persistence_threshold, at_least<int64_t>(0));
    v("stage3_max_live_parameters", stage3_max_live_parameters, at_least<int64_t>(0));
    v("stage3_max_reuse_distance", stage3_max_reuse_distance, at_least<int64_t>(0));
    v("stage3_gather_16bit_weights_on_model_save", stage3_gather_16bit_weights_on_model_save);
  }
};

// Asynchronous I/O for NVMe offload (DeepSpeed swap_tensor/constants.py).
struct AioConfig {
  int64_t block_size = 1048576;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
  template <class V> void fields(V& v) {
    v("block_size", block_size, at_least<int64_t>(512));
    v("queue_depth", queue_depth, at_least(1));
    v("intra_op_parallelism", intra_op_parallelism, at_least(1));
    v("single_submit", single_submit);
    v("overlap_events", overlap_events);
    v("use_gds", use_gds);
  }
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;
  bool cpu_checkpointing = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
  template <class V> void fields(V& v) {
    v("partition_activations", partition_activations);
    v("contiguous_memory_optimization", contiguous_memory_optimization);
    v("cpu_checkpointing", cpu_checkpointing);
    v("number_checkpoints", number_checkpoints, at_least<int64_t>(1));
    v("synchronize_checkpoint_boundary", synchronize_checkpoint_boundary);
    v("profile", profile);
  }
};

struct ParallelWriteConfig {
  bool pipeline_stage = false;
  template <class V> void fields(V& v) { v("pipeline_stage", pipeline_stage); }
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";
  bool load_universal = false;  // accepted: every tessera checkpoint reshards on load
  bool use_node_local_storage = false;
  ParallelWriteConfig parallel_write;
  // tessera's: a checkpoint every save_interval optimizer steps (0: none) into save_dir.
  int64_t save_interval = 0;
  std::string save_dir = "checkpoints";
  // tessera's (Megatron-Core's async_save, torch DCP's async_save): a save copies the state to host
  // memory and returns; a thread writes and commits it (engine/checkpoint/background_save.h).
  bool async_save = false;
  // tessera's (torchrun restarts a job; this makes it resume): at start the engine loads the latest
  // checkpoint of load_dir ("": save_dir). None there is an error unless start_fresh_if_missing.
  bool auto_resume = false;
  std::string load_dir;
  bool start_fresh_if_missing = false;
  template <class V> void fields(V& v) {
    v("save_interval", save_interval, at_least<int64_t>(0));
    v("async_save", async_save);
    v("save_dir", save_dir);
    v("auto_resume", auto_resume);
    v("load_dir", load_dir);
    v("start_fresh_if_missing", start_fresh_if_missing);
    v("tag_validation", tag_validation, one_of({"Ignore", "Warn", "Fail"}));
    v("load_universal", load_universal);
    v("use_node_local_storage", use_node_local_storage);
    v("parallel_write", parallel_write);
  }
};

// DeepSpeed's "data_types" section.
struct DataTypesConfig {
  // The dtype the whole gradient is accumulated in at ZeRO 0–1: "fp32" (tessera's default), or
  // "bf16" with bf16 compute (2 bytes an element instead of 4; DeepSpeed's default there).
  std::string grad_accum_dtype = "fp32";
  template <class V> void fields(V& v) { v("grad_accum_dtype", grad_accum_dtype, one_of({"fp32", "bf16"})); }
};

struct Config {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<OptimizerConfig> optimizer;
  std::optional<SchedulerConfig> scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  double gradient_clipping = 0.0;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  ZeroConfig zero_optimization;
  AioConfig aio;
  TensorParallelConfig tensor_parallel;
  PipelineConfig pipeline;
  ContextParallelConfig context_parallel;
  std::optional<int> sequence_parallel_size;  // DeepSpeed's key for context_parallel.size (Ulysses)
  // Absent unless the config has the section: tessera.initialize then configures the model's
  // checkpoint() calls from it (python/tessera/checkpointing.py), as deepspeed.initialize does.
  std::optional<ActivationCheckpointingConfig> activation_checkpointing;
  CheckpointConfig checkpoint;
  std::optional<MoeConfig> moe;  // absent unless the config has the section
  std::optional<ElasticityConfig> elasticity;  // absent unless the config has the section
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  WandbConfig wandb;
  CometConfig comet;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  // Every steps_per_print steps rank 0 prints the engine's buffers by kind and the process's peak
  // (the device allocator's too on GPUs).
  bool memory_breakdown = false;
  DataTypesConfig data_types;
  // tessera's own switch: "warn" downgrades unknown and unsupported keys to warnings, for
  // configs carried over from elsewhere.
  std::string unknown_keys = "error";
  // The dtype gradients are reduced in (DeepSpeed's key); unset: the gradient buffer's own dtype
  // (fp32 unless data_types.grad_accum_dtype says bf16), as in DeepSpeed.
  std::optional<std::string> communication_data_type;
  // DeepSpeed's gradient averaging order: divide by the data-parallel size before the reduction
  // (prescale_gradients) or by gradient_predivide_factor before and the rest after; the default
  // divides after. The result is the same average; dividing first keeps fp16/bf16 sums in range.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // DeepSpeed's consent to run a client optimizer it has not tested under ZeRO: tessera runs a
  // script's own torch optimizer over each rank's flat fp32 shard (zero stages 1-3 need this true).
  bool zero_allow_untested_optimizer = false;

  template <class V> void fields(V& v) {
    v("train_batch_size", train_batch_size, at_least<int64_t>(1));
    v("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, at_least<int64_t>(1));
    v("gradient_accumulation_steps", gradient_accumulation_steps, at_least<int64_t>(1));
    v("optimizer", optimizer);
    v("scheduler", scheduler);
    v("fp16", fp16);
    v.aliased("bf16", "bfloat16", bf16);
    v("gradient_clipping", gradient_clipping, at_least(0.0));
    v("steps_per_print", steps_per_print, at_least<int64_t>(1));
    v("wall_clock_breakdown", wall_clock_breakdown);
    v("zero_optimization", zero_optimization);
    v("aio", aio);
    v("tensor_parallel", tensor_parallel);
    v("pipeline", pipeline);
    v("context_parallel", context_parallel);
    v("sequence_parallel_size", sequence_parallel_size, at_least(1));
    v("activation_checkpointing", activation_checkpointing);
    v("checkpoint", checkpoint);
    v("moe", moe);
    v("elasticity", elasticity);
    v("csv_monitor", csv_monitor);
    v("tensorboard", tensorboard);
    v("wandb", wandb);
    v("comet", comet);
    v("comms_logger", comms_logger);
    v("flops_profiler", flops_profiler);
    v("memory_breakdown", memory_breakdown);
    v("data_types", data_types);
    v("unknown_keys", unknown_keys, one_of({"error", "warn"}));
    v("communication_data_type", communication_data_type, one_of({"fp32", "fp16", "bf16"}));
    v("prescale_gradients", prescale_gradients);
    v("gradient_predivide_factor", gradient_predivide_factor, greater_than(0.0));
    v("zero_allow_untested_optimizer", zero_allow_untested_optimizer);
  }
};

}  // namespace tessera
