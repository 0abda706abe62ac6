// `tessera plan`: the fastest layout that fits (engine/planner/planner.h, docs/planner.md). The
// flags become a JSON request, the same one tessera.plan takes from Python.
//
// Exit status: 0 a layout fits, 1 none does, 2 the inputs are invalid.
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/cli/commands.h"
#include "engine/cli/plan_trials.h"
#include "engine/planner/planner.h"

namespace tessera {

namespace {

struct PlanFlags {
  std::optional<std::string> preset, config, mlp, cp_method, optimizer, gpu_mem, cpu_mem, nvme, device, nvme_path;
  std::optional<std::string> offload_optimizer, offload_param, activation_checkpointing, schedule;
  std::optional<int64_t> moe_experts, moe_every, moe_k;
  std::optional<double> moe_capacity_factor;
  bool moe_drop_tokens = false;
  std::optional<int64_t> layers, hidden, heads, kv_heads, ffn, vocab, seq_len, max_positions, global_batch, micro_batch;
  std::optional<int> zero, tp, pp, cp, ep, virtual_stages, max_tp, gpus_per_node, nodes, cores_per_node;
  std::optional<double> gpu_tflops, intra_node_bw, inter_node_bw, pcie_bw, host_mem_bw, nvme_bw, latency, overlap_exposed;
  bool bf16 = false, fp16 = false, json = false, measure = false, no_offload = false, no_cp = false, emulated_hosts = false;
  int top = 5;
  int trials = 0;
  std::string write_config, hostfile;
  int master_port = 29650;
};

nlohmann::json request_from(const PlanFlags& f) {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put("preset", f.preset), put("config", f.config), put("mlp", f.mlp), put("cp_method", f.cp_method);
  put("optimizer", f.optimizer), put("gpu_mem", f.gpu_mem), put("cpu_mem", f.cpu_mem), put("nvme", f.nvme);
  put("device", f.device), put("nvme_path", f.nvme_path);
  put("offload_optimizer", f.offload_optimizer), put("offload_param", f.offload_param);
  put("activation_checkpointing", f.activation_checkpointing), put("schedule", f.schedule);
  put("virtual_stages", f.virtual_stages), put("ep", f.ep);
  put("moe_experts", f.moe_experts), put("moe_every", f.moe_every), put("moe_k", f.moe_k);
  put("moe_capacity_factor", f.moe_capacity_factor);
  if (f.moe_drop_tokens) j["moe_drop_tokens"] = true;
  put("layers", f.layers), put("hidden", f.hidden), put("heads", f.heads), put("kv_heads", f.kv_heads);
  put("ffn", f.ffn), put("vocab", f.vocab), put("seq_len", f.seq_len), put("max_positions", f.max_positions);
  put("global_batch", f.global_batch), put("micro_batch", f.micro_batch);
  put("zero", f.zero), put("tp", f.tp), put("pp", f.pp), put("cp", f.cp), put("max_tp", f.max_tp);
  put("gpus_per_node", f.gpus_per_node), put("nodes", f.nodes), put("cores_per_node", f.cores_per_node);
  put("gpu_tflops", f.gpu_tflops), put("intra_node_bw", f.intra_node_bw), put("inter_node_bw", f.inter_node_bw);
  put("pcie_bw", f.pcie_bw), put("host_mem_bw", f.host_mem_bw), put("nvme_bw", f.nvme_bw);
  put("collective_latency_us", f.latency), put("overlap_exposed", f.overlap_exposed);
  if (f.emulated_hosts) j["emulated_hosts"] = true;
  if (f.bf16) j["bf16"] = true;
  if (f.fp16) j["fp16"] = true;
  if (f.measure) j["measure"] = true;
  if (f.no_offload) j["offload"] = false;
  if (f.no_cp) j["cp_search"] = false;
  return j;
}

int run_plan(const PlanFlags& f, const std::vector<std::string>& program) {
  planner::PlanResult result;
  try {
    result = planner::plan(planner::plan_inputs_from_json(request_from(f)));
  } catch (const std::exception& e) {
    std::cerr << "tessera plan: " << e.what();
    if (std::string(e.what()).back() != '\n') std::cerr << "\n";
    return 2;
  }
  std::vector<Trial> trials;
  if (f.trials > 0 && !result.ranked.empty()) {
    TrialOptions options;
    options.program = program;
    options.hostfile = f.hostfile;
    options.master_port = f.master_port;
    try {
      trials = run_trials(result, f.trials, options);
    } catch (const std::exception& e) {
      std::cerr << "tessera plan: " << e.what() << "\n";
      return 2;
    }
  }
  const Trial* chosen = fastest(trials);
  if (f.json) {
    nlohmann::json j = planner::plan_to_json(result, f.top);
    if (!trials.empty()) j["trials"] = trials_to_json(trials);
    if (chosen) j["chosen"] = chosen->config;
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << planner::format_plan(result, f.top);
    if (!trials.empty()) std::cout << format_trials(trials);
  }
  if (!f.write_config.empty() && !result.ranked.empty()) {
    std::ofstream out(f.write_config);
    out << (chosen ? chosen->config : result.ranked.front().config).dump(2) << "\n";
    if (!out) {
      std::cerr << "tessera plan: could not write " << f.write_config << "\n";
      return 2;
    }
    if (!f.json) std::cout << "wrote " << f.write_config << "\n";
  }
  return result.ranked.empty() ? 1 : 0;
}

}  // namespace

void register_plan_command(CLI::App& app, int& exit_code, const std::vector<std::string>& program) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Choose the data, tensor, pipeline, context and expert degrees, pipeline schedule, ZeRO stage, "
              "offload, micro-batch and checkpointing: every layout that fits, ranked by predicted step time");
  sub->footer(
      "A layout flag (--zero, --tp, --pp, --cp, --ep, --schedule, --micro-batch, --offload-*,\n"
      "--activation-checkpointing) fixes that choice; the rest are searched. Sizes: a number is GiB, or 80GiB, 512MiB. Exit status: 0 a layout fits, 1 none\n"
      "does, 2 invalid inputs. docs/planner.md has the cost model.");
  sub->add_option("--preset", f->preset, "A named model (tessera estimate --list-presets)")->group("Model");
  sub->add_option("--layers", f->layers, "Transformer layers")->group("Model");
  sub->add_option("--hidden", f->hidden, "Hidden size")->group("Model");
  sub->add_option("--heads", f->heads, "Attention heads")->group("Model");
  sub->add_option("--kv-heads", f->kv_heads, "Key/value heads (default: heads)")->group("Model");
  sub->add_option("--ffn", f->ffn, "MLP inner size (default 4 x hidden)")->group("Model");
  sub->add_option("--vocab", f->vocab, "Vocabulary size")->group("Model");
  sub->add_option("--seq-len", f->seq_len, "Training sequence length")->group("Model");
  sub->add_option("--max-positions", f->max_positions, "Learned position embeddings (GPT-2; 0: rotary)")->group("Model");
  sub->add_option("--mlp", f->mlp, "gelu or swiglu")->check(CLI::IsMember({"gelu", "swiglu"}))->group("Model");
  sub->add_option("--moe-experts", f->moe_experts, "MoE blocks with this many experts (the config's moe.num_experts)")->group("Model");
  sub->add_option("--moe-every", f->moe_every, "Every how many blocks is an MoE block (2)")->group("Model");
  sub->add_option("--moe-k", f->moe_k, "Experts per token (2)")->group("Model");
  sub->add_option("--moe-capacity-factor", f->moe_capacity_factor, "MoE capacity factor (1.0)")->group("Model");
  sub->add_flag("--moe-drop-tokens", f->moe_drop_tokens, "MoE with a capacity that drops tokens (default: dropless)")->group("Model");
  sub->add_option("--global-batch", f->global_batch, "Samples per optimizer step (train_batch_size)")->required()->group("Training");
  sub->add_option("--config", f->config, "tessera/DeepSpeed config JSON: its optimizer, precision and other keys")->group("Training");
  sub->add_flag("--bf16", f->bf16, "bf16 compute")->group("Training");
  sub->add_flag("--fp16", f->fp16, "fp16 compute")->group("Training");
  sub->add_option("--optimizer", f->optimizer, "Adam, AdamW, Lamb, SGD (default: the config's, else AdamW)")->group("Training");
  sub->add_option("--zero", f->zero, "Fix the ZeRO stage")->check(CLI::Range(0, 3))->group("Layout");
  sub->add_option("--tp", f->tp, "Fix the tensor-parallel degree")->group("Layout");
  sub->add_option("--pp", f->pp, "Fix the pipeline stages")->group("Layout");
  sub->add_option("--cp", f->cp, "Fix the context-parallel degree")->group("Layout");
  sub->add_option("--cp-method", f->cp_method, "ulysses (default) or ring")->check(CLI::IsMember({"ulysses", "ring"}))->group("Layout");
  sub->add_option("--ep", f->ep, "Fix the expert-parallel degree (an MoE model)")->group("Layout");
  sub->add_option("--schedule", f->schedule, "Fix the pipeline schedule: 1f1b, zb_h1, interleaved_1f1b, zb_v or gpipe")
      ->check(CLI::IsMember({"1f1b", "zb_h1", "interleaved_1f1b", "zb_v", "gpipe"}))
      ->group("Layout");
  sub->add_option("--virtual-stages", f->virtual_stages, "Model chunks a stage for interleaved 1F1B (2)")->group("Layout");
  sub->add_option("--micro-batch", f->micro_batch, "Fix the micro-batch per rank")->group("Layout");
  sub->add_option("--offload-optimizer", f->offload_optimizer, "Fix: none, cpu or nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->group("Layout");
  sub->add_option("--offload-param", f->offload_param, "Fix: none, cpu or nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->group("Layout");
  sub->add_option("--activation-checkpointing", f->activation_checkpointing, "Fix: none or full")
      ->check(CLI::IsMember({"none", "full"}))->group("Layout");
  sub->add_option("--max-tp", f->max_tp, "Largest tensor-parallel degree (default: the ranks of a node)")->group("Layout");
  sub->add_flag("--no-offload", f->no_offload, "Never offload")->group("Layout");
  sub->add_flag("--no-cp", f->no_cp, "No context parallelism")->group("Layout");
  sub->add_option("--nvme-path", f->nvme_path, "offload's nvme_path in the written config (/local_nvme)")->group("Layout");
  sub->add_option("--gpus-per-node", f->gpus_per_node, "GPUs (ranks) per node (1)")->group("Hardware");
  sub->add_option("--nodes", f->nodes, "Nodes (1)")->group("Hardware");
  sub->add_option("--device", f->device, "gpu, or cpu: ranks are CPU processes on this kind of machine")
      ->check(CLI::IsMember({"gpu", "cpu"}))->group("Hardware");
  sub->add_option("--gpu-mem", f->gpu_mem, "Memory per GPU (80)")->group("Hardware");
  sub->add_option("--cpu-mem", f->cpu_mem, "CPU memory per node (--device cpu: this machine's)")->group("Hardware");
  sub->add_option("--nvme", f->nvme, "NVMe capacity per node (NVMe offload only when given)")->group("Hardware");
  sub->add_option("--cores-per-node", f->cores_per_node, "--device cpu: the cores the ranks share (this machine's)")->group("Hardware");
  sub->add_flag("--emulated-hosts", f->emulated_hosts,
                "--device cpu: the nodes are scripts/cluster.sh's emulated hosts of this machine (every rank shares its cores)")
      ->group("Hardware");
  sub->add_flag("--measure", f->measure, "--device cpu: time matrix products and memory here now (and cache them)")
      ->group("Calibration");
  sub->add_option("--gpu-tflops", f->gpu_tflops, "Achieved TFLOP/s per rank")->group("Calibration");
  sub->add_option("--intra-node-bw", f->intra_node_bw, "Collective bandwidth inside a node, GB/s")->group("Calibration");
  sub->add_option("--inter-node-bw", f->inter_node_bw, "Per rank between nodes, GB/s")->group("Calibration");
  sub->add_option("--pcie-bw", f->pcie_bw, "Host <-> device, GB/s")->group("Calibration");
  sub->add_option("--host-mem-bw", f->host_mem_bw, "Host memory bandwidth per node, GB/s")->group("Calibration");
  sub->add_option("--nvme-bw", f->nvme_bw, "NVMe bandwidth per node, GB/s")->group("Calibration");
  sub->add_option("--overlap-exposed", f->overlap_exposed,
                  "Share of an overlapped collective's time still paid, 0-1 (GPU 0, CPU ranks 0.5)")->group("Calibration");
  sub->add_option("--collective-latency-us", f->latency, "Seconds x 1e6 a collective costs beyond its bytes")->group("Calibration");
  sub->add_option("--top", f->top, "How many layouts to print (5)")->group("Output");
  sub->add_flag("--json", f->json, "Machine-readable output: every layout, ranked and rejected")->group("Output");
  sub->add_option("--write-config", f->write_config, "Write the best layout's config here (with --trials: the fastest measured)")
      ->group("Output");
  sub->add_option("--trials", f->trials, "Run the top K layouts a few steps each: tessera plan ... --trials 3 -- PROGRAM ARGS "
                                         "(each gets --config FILE, or its {config} argument replaced)")->group("Trials");
  sub->add_option("--hostfile", f->hostfile, "Trials across the hosts of this hostfile (tessera launch --hostfile)")->group("Trials");
  sub->add_option("--master-port", f->master_port, "The first trial's rendezvous port (29650; then +1 each)")->group("Trials");
  sub->callback([f, &exit_code, &program] { exit_code = run_plan(*f, program); });
}

}  // namespace tessera
