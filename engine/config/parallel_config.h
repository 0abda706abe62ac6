// The config's sections for the parallel layout beyond data parallelism: tensor, pipeline, context
// and expert parallelism, and DeepSpeed's elasticity. Part of the typed config (engine/config/config.h,
// which holds the top-level Config and explains the `fields(v)` convention).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config_rules.h"

namespace tessera {

struct TensorParallelConfig {
  int tp_size = 1;
  // tessera's key: Megatron-SP (activations outside the tensor-parallel layers split along the
  // sequence), applied by the model (tessera.tensor_parallel.parallelize, the example GPT).
  bool sequence_parallel = false;
  template <class V> void fields(V& v) {
    v.aliased("tp_size", "autotp_size", tp_size, at_least(1));
    v("sequence_parallel", sequence_parallel);
  }
};

struct PipelineConfig {
  int stages = 1;
  std::string partition_method = "parameters";
  std::optional<int64_t> micro_batches;  // resolved: gradient_accumulation_steps
  int activation_checkpoint_interval = 0;
  // tessera's keys (parallel/pipeline/schedule.h): "1f1b" (PipeDream-flush), "gpipe", "zb_h1" (zero
  // bubble: each backward split, weight gradients deferred), "interleaved_1f1b" with
  // virtual_stages model chunks per stage (Megatron's virtual pipeline size) or "zb_v" (zero bubble
  // with two chunks a stage in a V; virtual_stages resolves to 2).
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  // tessera's key: at ZeRO-3, when a stage's partitioned parameters are gathered: "step" (once per
  // batch, kept whole while the stage runs its micro-batches, as torchtitan keeps FSDP's unsharded
  // under a pipeline) or "micro_batch" (around each forward and backward: less memory, one allgather
  // each).
  std::string zero3_gather = "step";
  bool dynamic_shape = false;     // tessera's key: send each activation's shape with it (shapes vary by micro-batch)
  template <class V> void fields(V& v) {
    v("stages", stages, at_least(1));
    v("partition_method", partition_method, partition_method_rule());
    v("micro_batches", micro_batches, at_least<int64_t>(1));
    v("activation_checkpoint_interval", activation_checkpoint_interval, at_least(0));
    v("schedule", schedule, one_of({"1f1b", "gpipe", "interleaved_1f1b", "zb_h1", "zb_v"}));
    v("virtual_stages", virtual_stages, at_least(1));
    v("zero3_gather", zero3_gather, one_of({"step", "micro_batch"}));
    v("dynamic_shape", dynamic_shape);
  }
};

// tessera's section for context parallelism (docs/context_parallel.md): every sequence split over
// `size` ranks that see the same samples, attention computed across them by `method`: "ulysses"
// (all-to-all from sequence-split to head-split and back; Jacobs et al. 2023) or "ring" (key/value
// blocks passed around the group, merged by log-sum-exp; Liu et al. 2023). DeepSpeed's top-level
// sequence_parallel_size sets the size too. The grid is pipe × data × context × tensor.
struct ContextParallelConfig {
  int size = 1;
  std::string method = "ulysses";
  template <class V> void fields(V& v) {
    v("size", size, at_least(1));
    v("method", method, one_of({"ulysses", "ring"}));
  }
};

// DeepSpeed's "elasticity" section (elasticity/elasticity.py): the batch layout that keeps the
// global batch the same across the world sizes a job may run at (engine/config/elasticity.h
// computes it as DeepSpeed does). When enabled it decides train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps for the world size at hand.
struct ElasticityConfig {
  bool enabled = false;
  std::optional<int64_t> max_train_batch_size;  // required when enabled
  std::vector<int64_t> micro_batch_sizes;       // required when enabled
  int64_t min_gpus = 1;
  int64_t max_gpus = 10000;
  int64_t num_gpus_per_node = 1;
  int64_t model_parallel_size = 1;
  double min_time = 0;  // accepted, unused (as in DeepSpeed)
  bool prefer_larger_batch = true;
  bool ignore_non_elastic_batch_info = false;
  double version = 0.2;
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("max_train_batch_size", max_train_batch_size, at_least<int64_t>(1));
    v("micro_batch_sizes", micro_batch_sizes);
    v("min_gpus", min_gpus, at_least<int64_t>(1));
    v("max_gpus", max_gpus, at_least<int64_t>(1));
    v("num_gpus_per_node", num_gpus_per_node, at_least<int64_t>(1));
    v("model_parallel_size", model_parallel_size, at_least<int64_t>(1));
    v("min_time", min_time, at_least(0.0));
    v("prefer_larger_batch", prefer_larger_batch);
    v("ignore_non_elastic_batch_info", ignore_non_elastic_batch_info);
    v("version", version);
  }
};

// tessera's section for a model's Mixture-of-Experts blocks (docs/moe.md): the example GPT and the
// estimator read it; a Python model builds tessera.moe.MoE layers itself and needs none. Block l
// (from 0) is an MoE block when (l + 1) % every == 0: every other block with the default.
struct MoeConfig {
  int64_t num_experts = 8;
  int64_t every = 2;
  int64_t ep_size = 1;  // divides num_experts and the data-parallel size (checked where the grid is)
  int64_t k = 2;
  double capacity_factor = 1.0;
  double eval_capacity_factor = 1.0;
  int64_t min_capacity = 4;
  bool drop_tokens = false;  // dropless, as Megatron-Core and torchtitan run by default
  bool use_rts = true;
  double aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.0;
  template <class V> void fields(V& v) {
    v("num_experts", num_experts, at_least<int64_t>(1));
    v("every", every, at_least<int64_t>(1));
    v("ep_size", ep_size, at_least<int64_t>(1));
    v("k", k, at_least<int64_t>(1));
    v("capacity_factor", capacity_factor, greater_than(0.0));
    v("eval_capacity_factor", eval_capacity_factor, greater_than(0.0));
    v("min_capacity", min_capacity, at_least<int64_t>(0));
    v("drop_tokens", drop_tokens);
    v("use_rts", use_rts);
    v("aux_loss_coef", aux_loss_coef, at_least(0.0));
    v("router_z_loss_coef", router_z_loss_coef, at_least(0.0));
  }
};

}  // namespace tessera
