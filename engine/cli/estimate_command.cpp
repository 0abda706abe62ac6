// `tessera estimate`: will a training configuration fit, and what is the cheapest layout that fits
// (engine/estimator/estimator.h, docs/estimator.md). The flags become a JSON request, the same one
// tessera::estimate_json takes from Python, so both read it identically.
//
// Exit status: 0 fits, 1 does not fit, 2 the inputs are invalid.
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/cli/commands.h"
#include "engine/estimator/estimator.h"

namespace tessera {

namespace {

struct EstimateFlags {
  std::optional<std::string> params, largest_layer_params;
  std::optional<int64_t> layers, hidden, heads, kv_heads, ffn, vocab, seq_len, max_positions;
  std::optional<std::string> mlp, norm, preset, config, attention;
  std::optional<int> zero;
  std::optional<std::string> offload_optimizer, offload_param, optimizer, precision;
  bool bf16 = false, fp16 = false;
  std::optional<int64_t> micro_batch, gas, pipeline_micro_batches, reduce_bucket_size, max_micro_batch;
  std::optional<int> tp, pp, checkpoint_interval, param_groups, gpus_per_node, nodes;
  bool sequence_parallel = false, flash_attention = false, no_search = false, json = false, list_presets = false;
  std::string activation_checkpointing;
  CLI::Option* checkpointing_flag = nullptr;
  std::optional<std::string> gpu_mem, cpu_mem, nvme, device, device_overhead, host_overhead;
  std::optional<double> fragmentation;
  std::optional<double> gpu_tflops, intra_node_bw, inter_node_bw, pcie_bw, host_mem_bw, nvme_bw;
  std::optional<int64_t> moe_experts, moe_every, moe_k, ep, cp;
  std::optional<std::string> cp_method;
  std::optional<double> moe_capacity_factor;
  bool moe_drop_tokens = false;
};

// "7B", "6.74e9", "131M", "842496" -> a count.
int64_t parse_count(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double v;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    throw std::invalid_argument(flag + ": not a count: \"" + text + "\" (examples: 7B, 350M, 842496)");
  }
  std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1e3;
  else if (unit == "M" || unit == "m") scale = 1e6;
  else if (unit == "B" || unit == "b" || unit == "G" || unit == "g") scale = 1e9;
  else if (unit == "T" || unit == "t") scale = 1e12;
  else if (!unit.empty()) throw std::invalid_argument(flag + ": unknown suffix in \"" + text + "\" (K, M, B, T)");
  if (!(v > 0)) throw std::invalid_argument(flag + ": must be > 0");
  return static_cast<int64_t>(std::llround(v * scale));
}

nlohmann::json request_from(const EstimateFlags& f) {
  nlohmann::json j = nlohmann::json::object();
  if (f.params) j["params"] = parse_count(*f.params, "--params");
  if (f.largest_layer_params) j["largest_layer_params"] = parse_count(*f.largest_layer_params, "--largest-layer-params");
  auto put = [&](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put("layers", f.layers), put("hidden", f.hidden), put("heads", f.heads), put("kv_heads", f.kv_heads);
  put("ffn", f.ffn), put("vocab", f.vocab), put("seq_len", f.seq_len), put("max_positions", f.max_positions);
  put("mlp", f.mlp), put("norm", f.norm), put("preset", f.preset), put("config", f.config);
  put("zero", f.zero), put("offload_optimizer", f.offload_optimizer), put("offload_param", f.offload_param);
  put("optimizer", f.optimizer), put("precision", f.precision);
  if (f.bf16) j["bf16"] = true;
  if (f.fp16) j["fp16"] = true;
  put("micro_batch", f.micro_batch), put("gas", f.gas), put("pipeline_micro_batches", f.pipeline_micro_batches);
  put("reduce_bucket_size", f.reduce_bucket_size), put("max_micro_batch", f.max_micro_batch);
  put("tp", f.tp), put("pp", f.pp), put("checkpoint_interval", f.checkpoint_interval);
  put("param_groups", f.param_groups), put("gpus_per_node", f.gpus_per_node), put("nodes", f.nodes);
  if (f.sequence_parallel) j["sequence_parallel"] = true;
  if (f.flash_attention) j["flash_attention"] = true;
  put("attention", f.attention);
  put("gpu_tflops", f.gpu_tflops), put("intra_node_bw", f.intra_node_bw), put("inter_node_bw", f.inter_node_bw);
  put("pcie_bw", f.pcie_bw), put("host_mem_bw", f.host_mem_bw), put("nvme_bw", f.nvme_bw);
  if (f.checkpointing_flag->count() > 0)
    j["activation_checkpointing"] = f.activation_checkpointing.empty() ? "full" : f.activation_checkpointing;
  put("gpu_mem", f.gpu_mem), put("cpu_mem", f.cpu_mem), put("nvme", f.nvme), put("device", f.device);
  put("device_overhead", f.device_overhead), put("host_overhead", f.host_overhead);
  put("fragmentation", f.fragmentation);
  put("moe_experts", f.moe_experts), put("moe_every", f.moe_every), put("moe_k", f.moe_k), put("ep", f.ep);
  put("moe_capacity_factor", f.moe_capacity_factor);
  put("cp", f.cp), put("cp_method", f.cp_method);
  if (f.moe_drop_tokens) j["moe_drop_tokens"] = true;
  if (f.no_search) j["search"] = false;
  return j;
}

int run_estimate(const EstimateFlags& f) {
  if (f.list_presets) {
    for (const auto& p : model_presets()) {
      const int64_t n = param_count(transformer_tensors(p.shape));
      std::cout << p.name << std::string(p.name.size() < 13 ? 13 - p.name.size() : 1, ' ') << n << " params  "
                << p.description << "\n";
    }
    return 0;
  }
  EstimateResult result;
  try {
    result = estimate(estimate_inputs_from_json(request_from(f)));
  } catch (const std::exception& e) {
    std::cerr << "tessera estimate: " << e.what();
    if (std::string(e.what()).back() != '\n') std::cerr << "\n";
    return 2;
  }
  if (f.json) std::cout << estimate_to_json(result).dump(2) << std::endl;
  else std::cout << format_estimate(result);
  return result.fits ? 0 : 1;
}

}  // namespace

void register_estimate_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<EstimateFlags>();
  CLI::App* sub = app.add_subcommand(
      "estimate",
      "Estimate memory per GPU, per node's CPU and NVMe; say whether it fits and the cheapest layouts that do");
  sub->footer(
      "Sizes: a number is GiB; or 80GiB, 512MiB, 2TiB. Counts: 7B, 350M, 842496.\n"
      "Exit status: 0 fits, 1 does not fit, 2 invalid inputs. docs/estimator.md has every formula.");
  // The model.
  sub->add_option("--params", f->params, "Total parameter count (7B, 350M, 124439808)")->group("Model");
  sub->add_option("--largest-layer-params", f->largest_layer_params,
                  "Largest layer's parameter count (ZeRO-3 gathers it whole)")->group("Model");
  sub->add_option("--preset", f->preset, "A named model (--list-presets)")->group("Model");
  sub->add_flag("--list-presets", f->list_presets, "Print the presets and exit")->group("Model");
  sub->add_option("--layers", f->layers, "Transformer layers")->group("Model");
  sub->add_option("--hidden", f->hidden, "Hidden size")->group("Model");
  sub->add_option("--heads", f->heads, "Attention heads")->group("Model");
  sub->add_option("--kv-heads", f->kv_heads, "Key/value heads (grouped-query attention; default: heads)")->group("Model");
  sub->add_option("--ffn", f->ffn, "MLP inner size (default 4 x hidden)")->group("Model");
  sub->add_option("--vocab", f->vocab, "Vocabulary size")->group("Model");
  sub->add_option("--seq-len", f->seq_len, "Training sequence length")->group("Model");
  sub->add_option("--max-positions", f->max_positions, "Learned position embeddings (GPT-2; 0: rotary)")->group("Model");
  sub->add_option("--mlp", f->mlp, "gelu (2 matrices) or swiglu (3)")->check(CLI::IsMember({"gelu", "swiglu"}))->group("Model");
  sub->add_option("--norm", f->norm, "layernorm or rmsnorm")->check(CLI::IsMember({"layernorm", "rmsnorm"}))->group("Model");
  sub->add_option("--attention", f->attention,
                  "What attention stores: sdpa (default: scaled_dot_product_attention, no s x s scores) or eager "
                  "(written out: s x s scores, softmax and dropout masks per head)")
      ->check(CLI::IsMember({"sdpa", "eager"}))->group("Model");
  sub->add_flag("--flash-attention", f->flash_attention, "Same as --attention sdpa (the default)")->group("Model");
  // The training setup.
  sub->add_option("--config", f->config, "tessera/DeepSpeed config JSON; flags override its keys")->group("Training");
  sub->add_option("--zero", f->zero, "ZeRO stage 0-3")->check(CLI::Range(0, 3))->group("Training");
  sub->add_option("--offload-optimizer", f->offload_optimizer, "none, cpu or nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->group("Training");
  sub->add_option("--offload-param", f->offload_param, "none, cpu or nvme (ZeRO-3)")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->group("Training");
  sub->add_flag("--bf16", f->bf16, "bf16 compute, fp32 master weights")->group("Training");
  sub->add_flag("--fp16", f->fp16, "fp16 compute, fp32 master weights")->group("Training");
  sub->add_option("--optimizer", f->optimizer, "Adam, AdamW, Lamb, SGD, OneBitAdam, ZeroOneAdam, OneBitLamb (default Adam)")->group("Training");
  sub->add_option("--micro-batch", f->micro_batch, "Micro-batch per GPU")->group("Training");
  sub->add_option("--gas", f->gas, "Gradient accumulation steps")->group("Training");
  sub->add_option("--tp", f->tp, "Tensor-parallel degree")->group("Training");
  sub->add_option("--pp", f->pp, "Pipeline stages")->group("Training");
  sub->add_option("--pipeline-micro-batches", f->pipeline_micro_batches,
                  "Micro-batches per pipeline batch (= --gas)")->group("Training");
  sub->add_flag("--sequence-parallel", f->sequence_parallel, "Megatron sequence parallelism (with --tp)")->group("Training");
  sub->add_option("--moe-experts", f->moe_experts, "MoE blocks with this many experts (the config's moe.num_experts)")->group("Training");
  sub->add_option("--moe-every", f->moe_every, "Every how many blocks is an MoE block (2)")->group("Training");
  sub->add_option("--moe-k", f->moe_k, "Experts per token (2)")->group("Training");
  sub->add_option("--cp", f->cp, "Context-parallel degree (context_parallel.size): each rank holds seq_len/cp of a sequence")
      ->group("Training");
  sub->add_option("--cp-method", f->cp_method, "Context parallelism's attention: ulysses (all-to-all) or ring")
      ->group("Training");
  sub->add_option("--ep", f->ep, "Expert-parallel degree (divides the experts and the data-parallel size)")->group("Training");
  sub->add_option("--moe-capacity-factor", f->moe_capacity_factor, "MoE capacity factor (1.0)")->group("Training");
  sub->add_flag("--moe-drop-tokens", f->moe_drop_tokens, "MoE with a capacity that drops tokens (default: dropless)")->group("Training");
  f->checkpointing_flag =
      sub->add_option("--activation-checkpointing", f->activation_checkpointing,
                      "none, selective (attention core recomputed) or full; alone: full")
          ->expected(0, 1)
          ->check(CLI::IsMember({"none", "selective", "full", ""}))
          ->group("Training");
  sub->add_option("--checkpoint-interval", f->checkpoint_interval, "Full checkpointing every N layers (1)")->group("Training");
  sub->add_option("--param-groups", f->param_groups, "1: one flat buffer (default: 2 for shapes, 1 for counts)")->group("Training");
  sub->add_option("--reduce-bucket-size", f->reduce_bucket_size, "zero_optimization.reduce_bucket_size (elements)")->group("Training");
  // The hardware.
  sub->add_option("--gpus-per-node", f->gpus_per_node, "GPUs (ranks) per node (1)")->group("Hardware");
  sub->add_option("--nodes", f->nodes, "Nodes (1)")->group("Hardware");
  sub->add_option("--gpu-mem", f->gpu_mem, "Memory per GPU (80)")->group("Hardware");
  sub->add_option("--cpu-mem", f->cpu_mem, "CPU memory per node (not checked when not given)")->group("Hardware");
  sub->add_option("--nvme", f->nvme, "NVMe capacity per node (not checked when not given)")->group("Hardware");
  sub->add_option("--device", f->device, "gpu, or cpu: ranks are CPU processes")->check(CLI::IsMember({"gpu", "cpu"}))
      ->group("Hardware");
  sub->add_option("--fragmentation", f->fragmentation, "Allowance for fragmentation, a fraction (0.1)")->group("Hardware");
  sub->add_option("--device-overhead", f->device_overhead, "Per GPU: CUDA context and workspaces (1GiB)")->group("Hardware");
  sub->add_option("--host-overhead", f->host_overhead, "Per rank process on the host (1GiB; 0.5GiB with --device cpu)")
      ->group("Hardware");
  // The cost model's rates (docs/estimator.md, "Ranking: the cost model").
  sub->add_option("--gpu-tflops", f->gpu_tflops, "Achieved TFLOP/s per GPU in the compute dtype (150 bf16/fp16, 15 fp32)")
      ->group("Cost model");
  sub->add_option("--intra-node-bw", f->intra_node_bw, "Collective bus bandwidth within a node, GB/s (200)")->group("Cost model");
  sub->add_option("--inter-node-bw", f->inter_node_bw, "Per GPU between nodes, GB/s (25)")->group("Cost model");
  sub->add_option("--pcie-bw", f->pcie_bw, "Host <-> GPU per GPU, GB/s (20)")->group("Cost model");
  sub->add_option("--host-mem-bw", f->host_mem_bw, "Host memory bandwidth per node, GB/s (100): the CPU optimizer")
      ->group("Cost model");
  sub->add_option("--nvme-bw", f->nvme_bw, "NVMe bandwidth per node, GB/s (6)")->group("Cost model");
  // Output.
  sub->add_option("--max-micro-batch", f->max_micro_batch, "Largest micro-batch the search tries (1024)")->group("Output");
  sub->add_flag("--no-search", f->no_search, "Only the given configuration: no table, no options")->group("Output");
  sub->add_flag("--json", f->json, "Machine-readable output")->group("Output");
  sub->callback([f, &exit_code] { exit_code = run_estimate(*f); });
}

}  // namespace tessera
