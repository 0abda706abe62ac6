// The memory estimator: will a training configuration fit, and what is the cheapest layout that
// fits. Per GPU (or per rank on CPU-only runs), per node's CPU and per node's NVMe: parameters,
// fp32 master weights, gradients, optimizer states, communication buckets, activations
// (Korthikanti et al. 2022, with tensor/sequence parallelism, checkpointing and 1F1B pipelines;
// SDPA's attention memory by default, eager attention's on request), and an allowance for
// fragmentation and the framework. The search ranks the layouts that fit by a stated cost model
// (recomputation, communication, offload traffic). docs/estimator.md gives every formula.
//
// Model states follow tessera's engine byte by byte (docs/zero.md, zero/zero_optimizer.cpp): for
// ZeRO 0-3 and optimizer/parameter offload without tensor/pipeline parallelism they are what the
// engine allocates, checked against its measured memory by tests/engine/estimator/. With tensor or
// pipeline parallelism (which the engine runs) the figures are not checked against it yet: a
// design estimate (DeepSpeed-like), flagged as such in every output.
//
//   EstimateResult r = tessera::estimate(inputs);       // from C++
//   nlohmann::json j = tessera::estimate_to_json(r);    // what `tessera estimate --json` prints
//   nlohmann::json j = tessera::estimate_json(request); // the whole thing from a JSON request whose
//                                                       // keys are the CLI flags (for bindings)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/estimator/model_presets.h"

namespace tessera {

constexpr int64_t kGiB = int64_t(1) << 30;

// The model: a parameter count, a transformer shape (or a preset's), or an exact tensor list.
struct ModelSpec {
  std::string name;                       // preset name, or empty
  std::optional<TransformerShape> shape;  // enables activations and per-tensor layout
  int64_t params = 0;                     // total count; from the shape or tensors when 0
  int64_t largest_layer_params = 0;       // largest module (ZeRO-3 gathers it whole); from the shape when 0
  std::vector<ParamTensor> tensors;       // exact list in registration order; built from the shape when empty
};

// The training setup: what a tessera/DeepSpeed config says (setup_from_config), or flags.
struct TrainingSetup : ZeroSizeParams {
  int zero_stage = 0;
  std::string offload_optimizer = "none";  // none | cpu | nvme
  std::string offload_param = "none";      // none | cpu | nvme (ZeRO-3 only)
  bool super_offload = false;              // offload_optimizer.super_offload: a host copy of what each step writes
  std::string precision = "fp32";          // fp32 | bf16 | fp16
  std::string grad_accum_dtype = "fp32";   // data_types.grad_accum_dtype: fp32 | bf16 (stages 0-1)
  std::string communication_dtype;         // communication_data_type; empty: the gradients' own
  std::string optimizer = "Adam";          // Adam | AdamW | Lamb: 8 bytes of state; SGD: 4 with momentum, 0 without;
                                           // OneBitAdam 12, ZeroOneAdam and OneBitLamb 16 (estimator_detail.h)
  double momentum = 0.0;                   // SGD
  int64_t micro_batch = 1;                 // per GPU
  int64_t gradient_accumulation = 1;
  int64_t pipeline_micro_batches = 0;      // 0: gradient_accumulation (DeepSpeed's default)
  // pipeline.schedule and virtual_stages: what a stage holds in flight (the schedule's simulated
  // peak: 1F1B min(pp - stage, m); ZB-H1 up to pp; interleaved more than 1F1B; zb_v (virtual_stages
  // 2) up to pp on every stage, the head and the loss on stage 0).
  std::string pipeline_schedule = "1f1b";
  int virtual_stages = 1;
  int tp = 1;
  int pp = 1;
  bool sequence_parallel = false;          // Megatron's sequence parallelism (with tp > 1)
  int cp = 1;                              // context_parallel.size: each rank holds seq_len / cp of a sequence
  std::string context_method = "ulysses";  // context_parallel.method: ulysses | ring (their buffers differ)
  std::string activation_checkpointing = "none";  // none | selective (attention core) | full
  int checkpoint_interval = 1;             // full: checkpoint every this many layers
  bool partition_activations = false;      // DeepSpeed: checkpoints split across tensor-parallel ranks
  bool cpu_checkpointing = false;          // DeepSpeed: checkpoints kept in CPU memory
  bool async_checkpoint = false;           // checkpoint.async_save: a save's host copy of the rank's state
  // What the attention stores for the backward (docs/estimator.md, "Activations"):
  //   "sdpa" (default): torch.nn.functional.scaled_dot_product_attention (FlashAttention,
  //     memory-efficient or cuDNN kernels): q, k, v, the output and an fp32 log-sum-exp per row and
  //     head; no s×s scores, softmax or dropout mask (dropout is regenerated from the RNG seed).
  //   "eager": attention written out (softmax(QKᵀ)V): the s×s softmax output, with dropout its
  //     1-byte mask and its output, per head (Korthikanti et al. 2022, 5as/h per layer).
  // This decides for every shape: estimate() writes it into the resolved shape's flash_attention.
  std::string attention = "sdpa";
  std::optional<bool> flash_attention;     // legacy: true = "sdpa", false = "eager"; overrides `attention`
  int param_groups = 0;                    // 0: the tensors' groups (2 for shapes, 1 for a bare count)
  // DeepSpeed knobs that size buffers (zero_optimization.*): the sizes (reduce_bucket_size,
  // sub_group_size, stage3_*) are the base ZeroSizeParams's (zero/options.h), with its defaults.
  int optimizer_buffer_count = kOptimizerSwapBufferCount;  // offload_optimizer.buffer_count (NVMe swap buffers)
  double offload_optimizer_ratio = 1.0;                    // offload_optimizer.ratio (ZeRO-3: fraction offloaded)
  // The model's MoE blocks and their expert parallelism (the config's "moe" section): experts
  // counted over ep_size, their optimizer state over dp/ep, the all-to-all buffers and the
  // activations at the capacity (dropless: at the worst case, docs/estimator.md).
  std::optional<MoeConfig> moe;
  int param_buffer_count = kParameterSwapBufferCount;      // offload_param.buffer_count
  int64_t param_buffer_size = kParameterSwapBufferNumel;   // offload_param.buffer_size (elements)
};

// A config file's choices (a resolved Config: load_config or resolve_config has run).
TrainingSetup setup_from_config(const Config& config);

struct Hardware {
  std::string device = "gpu";   // "gpu", or "cpu": ranks are CPU processes (tessera without a GPU)
  int gpus_per_node = 1;        // ranks per node
  int nodes = 1;
  int64_t gpu_memory = 80 * kGiB;  // per GPU
  int64_t cpu_memory = 0;          // per node; 0: not checked
  int64_t nvme_capacity = 0;       // per node; 0: no NVMe (NVMe offload does not fit)
  // Rates for the search's cost model (docs/estimator.md, "Ranking: the cost model"); < 0: the
  // default for the device (gpu: an A100-80GB-class node; cpu: tessera's CPU ranks over Gloo).
  double gpu_tflops = -1;         // achieved dense throughput per GPU (per rank) in the compute dtype, 10^12 FLOP/s
  double intra_node_gbps = -1;    // collective bus bandwidth between the ranks of one node, GB/s (10^9 B/s)
  double inter_node_gbps = -1;    // ... per GPU when the data-parallel group spans nodes
  double pcie_gbps = -1;          // host <-> GPU, per GPU (offload traffic)
  double host_memory_gbps = -1;   // per node: the CPU optimizer step is memory-bound (docs/cpu_adam.md)
  double nvme_gbps = -1;          // per node, read or write
};

// The stated allowance on top of the computed buffers.
struct Allowance {
  double fragmentation = 0.10;   // fraction added to the computed device (and host) bytes
  int64_t device_overhead = -1;  // per GPU: CUDA context, cuBLAS/NCCL workspaces; -1: 1 GiB (gpu), 0 (cpu)
  int64_t host_overhead = -1;    // per rank process on the host: -1: 1 GiB (gpu), 0.5 GiB (cpu: libtorch, measured 0.47)
};

struct EstimateInputs {
  ModelSpec model;
  TrainingSetup setup;
  Hardware hardware;
  Allowance allowance;
  bool search = true;            // fill `table` and `options`
  int64_t max_micro_batch = 1024;  // the search tries powers of two up to this
};

struct MemoryLine {
  std::string name;
  int64_t bytes = 0;
  std::string detail;
};

// One place's bytes: the lines in print order, and the sums.
struct Placement {
  std::vector<MemoryLine> lines;
  int64_t model_states = 0;   // params + master + gradients + optimizer states held here
  int64_t activations = 0;
  int64_t buffers = 0;        // communication buckets / pinned swap buffers
  int64_t allowance = 0;      // fragmentation + fixed overhead
  int64_t steady = 0;         // the sum of the lines before the allowance (training steady state)
  int64_t construction = 0;   // the transient peak while the engine builds its buffers
  int64_t total = 0;          // the peak: max(steady state, construction peak) + allowance
  int64_t capacity = 0;
  bool check = false;         // false: the capacity was not given (CPU memory), nothing is checked
  bool checked() const { return check; }
  bool fits() const { return !check || total <= capacity; }
  int64_t bytes(const std::string& name) const;  // a line's bytes, 0 when absent
};

struct ActivationDetail {
  int64_t per_layer = 0;          // one layer, one micro-batch, as stored (checkpointing applied)
  int64_t per_layer_full = 0;     // one layer without checkpointing (what recomputation rebuilds)
  int64_t layers_held = 0;        // layers on the busiest stage
  int64_t in_flight = 1;          // micro-batches the busiest stage holds (1F1B: min(pp - stage, m); the schedule's
                                  // simulated peak, interleaved chunks rounded up to whole micro-batches)
  int64_t embedding = 0;          // per micro-batch, first stage
  int64_t logits = 0;             // last stage: fp32 logits and their gradient
  int64_t recompute = 0;          // one layer rebuilt during the backward (checkpointing)
  int64_t on_cpu = 0;             // cpu_checkpointing: per rank, in host memory
  int64_t moe_layers = 0;         // MoE layers on the busiest stage (TrainingSetup::moe)
  int64_t moe_extra = 0;          // what one of them stores beyond a dense layer, per micro-batch
  int64_t moe_rows = 0;           // rows this rank's experts process per MoE layer
  int64_t moe_all_to_all = 0;     // one MoE layer's all-to-all send and receive buffers (transient)
  int64_t context_extra = 0;      // context parallelism: what one layer's attention keeps beyond SDPA's (in per_layer)
  int64_t context_buffers = 0;    // ... and its transient buffers (Ulysses's all-to-alls, ring's blocks in flight)
  int stage = 0;                  // the pipeline stage with the largest total
  std::string formula;            // the per-layer formula used, in words
};

// What an option costs in speed (the search's cost model, option_cost in engine/estimator/estimator_cost.cpp):
// seconds per training sample on one GPU at the option's micro-batch, term by term, with no
// overlap between the terms. A ranking device, not a throughput prediction.
struct OptionCost {
  double compute = 0;        // forward + backward: 3 forward passes' FLOPs / gpu_tflops (0: no shape, unknown)
  double recompute = 0;      // activation checkpointing: one more forward of the layers (full), or of the attention core (selective)
  double communication = 0;  // data-parallel collectives (reduce-scatter, allgather, allreduce)
  double offload = 0;        // PCIe transfers, the CPU optimizer step, NVMe reads and writes
  double total() const { return compute + recompute + communication + offload; }
  double relative() const { return compute > 0 ? total() / compute : 0.0; }  // 1.00 = compute only; 0: unknown
};

// One row of the stage × offload table, or one option of the search (stage × offload ×
// activation checkpointing at its largest micro-batch).
struct OptionRow {
  int zero_stage = 0;
  std::string offload_optimizer, offload_param;
  std::string activation_checkpointing = "none";
  int64_t micro_batch = 0;        // the micro-batch the memory figures below are for
  int64_t per_gpu = 0, per_node_cpu = 0, per_node_nvme = 0;
  int64_t per_gpu_model_states = 0, per_gpu_activations = 0;
  bool fits = false;
  bool validated = false;         // model states checked against the engine
  int64_t max_micro_batch = 0;    // the largest power of two (<= max_micro_batch) that fits; 0: none
  OptionCost cost;                // at max_micro_batch (at micro_batch when nothing fits)
  std::string label() const;      // "offload_param=none, offload_optimizer=cpu , zero=2"
};

struct EstimateResult {
  // What was estimated.
  std::string model_name;
  int64_t params = 0, largest_layer_params = 0;
  int64_t params_per_gpu = 0;     // on the busiest stage's tensor-parallel rank
  int world = 1, dp = 1;
  TrainingSetup setup;
  Hardware hardware;
  Allowance allowance;            // with -1s resolved
  bool has_shape = false;
  std::optional<TransformerShape> shape;
  // The answer.
  Placement per_gpu, per_node_cpu, per_node_nvme;
  ActivationDetail activations;
  bool fits = false;
  bool validated = false;         // false: a design estimate (ZeRO-3, offload, tp/pp), not yet checked against the engine
  std::vector<std::string> notes;
  std::vector<std::string> shortfalls;  // "per GPU: 92.31 GiB needed, 80.00 GiB available: 12.31 GiB short"
  std::vector<OptionRow> table;         // every stage × offload choice at the given micro-batch and checkpointing
  // Every stage × offload × activation checkpointing (none, full; selective too with eager
  // attention) that fits at some micro-batch, at its largest micro-batch, cheapest first by
  // OptionCost::total (ties: larger micro-batch, lower stage, less offload, less recomputation).
  std::vector<OptionRow> options;
  std::string options_note;             // e.g. "nothing fits without activation checkpointing"
};

// Throws std::invalid_argument for inputs that cannot be estimated (no model, bad degrees, ...).
EstimateResult estimate(const EstimateInputs& inputs);

nlohmann::json estimate_to_json(const EstimateResult& result);

// The human-readable report: the setup, the chosen configuration's breakdown and verdict, the
// table over ZeRO stage × offload, and the options that fit, cheapest first, with their cost.
std::string format_estimate(const EstimateResult& result);

// A JSON request with the CLI's flags as keys ("params", "preset", "zero", "offload_optimizer",
// "bf16", "micro_batch", "tp", "gpus_per_node", "gpu_mem" in GiB, ..., "config": a path or an
// object); unknown keys are errors. For bindings: tessera.estimate(**kwargs).
EstimateInputs estimate_inputs_from_json(const nlohmann::json& request);
// A request's "config" value, a path, JSON text or an object, as JSON (std::invalid_argument
// naming what is wrong). The planner's requests read theirs the same way.
nlohmann::json config_json_of(const nlohmann::json& value);
// The keys such a request may have (the planner's requests add their own).
const std::set<std::string>& estimate_request_keys();
nlohmann::json estimate_json(const nlohmann::json& request);

// "80", "80GiB", "80GB" (read as GiB, as DeepSpeed's estimator prints), "512MiB", "2TiB", "1.5T"
// → bytes. Throws std::invalid_argument.
int64_t parse_memory_size(const std::string& text);
std::string format_gib(int64_t bytes);  // "12.34GiB"

}  // namespace tessera
