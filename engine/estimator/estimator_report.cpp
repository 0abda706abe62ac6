// The estimator's answer as JSON (`--json`, tessera.estimate) and as the text table (engine/estimator/estimator.h).
#include "engine/estimator/estimator.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "engine/config/config_io.h"
#include "engine/estimator/estimator_detail.h"

namespace tessera {

using nlohmann::json;
using namespace estimator_detail;

// ---- JSON -------------------------------------------------------------------------------------

int64_t Placement::bytes(const std::string& name) const {
  for (const auto& l : lines)
    if (l.name == name) return l.bytes;
  return 0;
}

std::string OptionRow::label() const {
  return "offload_param=" + offload_param + std::string(offload_param == "cpu" ? " " : "") +
         ", offload_optimizer=" + offload_optimizer + std::string(offload_optimizer == "cpu" ? " " : "") +
         ", zero_stage=" + std::to_string(zero_stage);
}


namespace {

json placement_json(const Placement& p) {
  json lines = json::array();
  for (const auto& l : p.lines) lines.push_back({{"name", l.name}, {"bytes", l.bytes}, {"detail", l.detail}});
  return {{"total_bytes", p.total},
          {"steady_bytes", p.steady},
          {"construction_peak_bytes", p.construction},
          {"model_states_bytes", p.model_states},
          {"activations_bytes", p.activations},
          {"buffers_bytes", p.buffers},
          {"allowance_bytes", p.allowance},
          {"capacity_bytes", p.capacity},
          {"checked", p.checked()},
          {"fits", p.fits()},
          {"lines", lines}};
}

json cost_json(const OptionCost& c) {
  return {{"relative", c.relative()},          {"seconds_per_sample", c.total()},
          {"compute_s", c.compute},            {"recompute_s", c.recompute},
          {"communication_s", c.communication}, {"offload_s", c.offload}};
}

json row_json(const OptionRow& r) {
  return {{"zero_stage", r.zero_stage},
          {"offload_optimizer", r.offload_optimizer},
          {"offload_param", r.offload_param},
          {"activation_checkpointing", r.activation_checkpointing},
          {"micro_batch", r.micro_batch},
          {"cost", cost_json(r.cost)},
          {"per_gpu_bytes", r.per_gpu},
          {"per_node_cpu_bytes", r.per_node_cpu},
          {"per_node_nvme_bytes", r.per_node_nvme},
          {"per_gpu_model_states_bytes", r.per_gpu_model_states},
          {"per_gpu_activations_bytes", r.per_gpu_activations},
          {"fits", r.fits},
          {"validated", r.validated},
          {"max_micro_batch", r.max_micro_batch}};
}

json shape_json(const TransformerShape& s) {
  return {{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads}, {"kv_heads", s.kv_heads > 0 ? s.kv_heads : s.heads},
          {"ffn", s.ffn_dim()}, {"vocab", s.vocab}, {"seq_len", s.seq_len}, {"max_positions", s.max_positions},
          {"mlp", s.mlp}, {"norm", s.norm}, {"biases", s.biases}, {"tied_embeddings", s.tied_embeddings},
          {"dropout", s.dropout}, {"flash_attention", s.flash_attention}};
}

}  // namespace

json estimate_to_json(const EstimateResult& r) {
  const auto& s = r.setup;
  json j;
  j["fits"] = r.fits;
  j["validated"] = r.validated;
  j["design_estimate"] = !r.validated;
  j["model"] = {{"name", r.model_name},
                {"params", r.params},
                {"largest_layer_params", r.largest_layer_params},
                {"params_per_gpu", r.params_per_gpu}};
  if (r.shape) j["model"]["shape"] = shape_json(*r.shape);
  j["setup"] = {{"zero_stage", s.zero_stage}, {"offload_optimizer", s.offload_optimizer},
                {"offload_param", s.offload_param}, {"precision", s.precision}, {"optimizer", s.optimizer},
                {"micro_batch", s.micro_batch}, {"gradient_accumulation", s.gradient_accumulation},
                {"pipeline_micro_batches", s.pipeline_micro_batches > 0 ? s.pipeline_micro_batches : s.gradient_accumulation},
                {"tp", s.tp}, {"pp", s.pp}, {"dp", r.dp}, {"cp", s.cp}, {"cp_method", s.context_method},
                {"sequence_parallel", s.sequence_parallel},
                {"activation_checkpointing", s.activation_checkpointing}, {"attention", s.attention},
                {"reduce_bucket_size", s.reduce_bucket_size}};
  j["hardware"] = {{"device", r.hardware.device}, {"gpus_per_node", r.hardware.gpus_per_node},
                   {"nodes", r.hardware.nodes}, {"world_size", r.world}, {"gpu_memory_bytes", r.hardware.gpu_memory},
                   {"cpu_memory_bytes", r.hardware.cpu_memory}, {"nvme_bytes", r.hardware.nvme_capacity},
                   {"cost_rates", {{"gpu_tflops", r.hardware.gpu_tflops}, {"intra_node_gbps", r.hardware.intra_node_gbps},
                                   {"inter_node_gbps", r.hardware.inter_node_gbps}, {"pcie_gbps", r.hardware.pcie_gbps},
                                   {"host_memory_gbps", r.hardware.host_memory_gbps}, {"nvme_gbps", r.hardware.nvme_gbps}}}};
  j["allowance"] = {{"fragmentation", r.allowance.fragmentation},
                    {"device_overhead_bytes", r.allowance.device_overhead},
                    {"host_overhead_per_rank_bytes", r.allowance.host_overhead}};
  j["per_gpu"] = placement_json(r.per_gpu);
  j["per_node_cpu"] = placement_json(r.per_node_cpu);
  j["per_node_nvme"] = placement_json(r.per_node_nvme);
  const auto& a = r.activations;
  j["activations"] = {{"per_layer_bytes", a.per_layer}, {"per_layer_full_bytes", a.per_layer_full},
                      {"layers_held", a.layers_held}, {"micro_batches_in_flight", a.in_flight},
                      {"embedding_bytes", a.embedding}, {"output_layer_bytes", a.logits},
                      {"recompute_bytes", a.recompute}, {"on_cpu_bytes", a.on_cpu}, {"pipeline_stage", a.stage},
                      {"formula", a.formula}, {"moe_layers", a.moe_layers}, {"moe_extra_bytes", a.moe_extra},
                      {"moe_rows", a.moe_rows}, {"moe_all_to_all_bytes", a.moe_all_to_all},
                      {"context_extra_bytes", a.context_extra}, {"context_buffer_bytes", a.context_buffers}};
  j["shortfalls"] = r.shortfalls;
  j["notes"] = r.notes;
  json table = json::array(), options = json::array();
  for (const auto& row : r.table) table.push_back(row_json(row));
  for (const auto& row : r.options) options.push_back(row_json(row));
  j["table"] = table;
  j["options"] = options;
  if (!r.options_note.empty()) j["options_note"] = r.options_note;
  return j;
}

// ---- text -------------------------------------------------------------------------------------

namespace {

std::string gib_col(int64_t bytes, int width) {
  std::string v = bytes == 0 ? "0" : format_gib(bytes);
  if (static_cast<int>(v.size()) < width) v = std::string(width - v.size(), ' ') + v;
  return v;
}

void print_placement(std::ostringstream& o, const std::string& title, const Placement& p) {
  o << title << "\n";
  for (const auto& l : p.lines) {
    std::string name = "  " + l.name;
    if (name.size() < 34) name += std::string(34 - name.size(), ' ');
    o << name << (l.bytes ? gib_col(l.bytes, 10) : std::string(10, ' ')) << "  " << l.detail << "\n";
  }
  std::string total = "  total";
  total += std::string(34 - total.size(), ' ');
  o << total << gib_col(p.total, 10);
  if (p.checked())
    o << "  of " << format_gib(p.capacity) << ": "
      << (p.fits() ? "fits, " + format_gib(p.capacity - p.total) + " free"
                   : "does NOT fit, " + format_gib(p.total - p.capacity) + " short");
  else if (p.total > 0)
    o << "  (capacity not given: not checked)";
  else if (p.total == 0)
    o << "  (none used)";
  o << "\n";
}

std::string setup_line(const EstimateResult& r) {
  const auto& s = r.setup;
  std::ostringstream o;
  o << "ZeRO-" << s.zero_stage << ", offload_optimizer=" << s.offload_optimizer << ", offload_param=" << s.offload_param
    << ", " << s.precision << ", " << s.optimizer << ", micro-batch " << s.micro_batch << ", gradient accumulation "
    << s.gradient_accumulation << ", tp " << s.tp << (s.sequence_parallel && s.tp > 1 ? " (sequence parallel)" : "")
    << ", pp " << s.pp;
  if (s.cp > 1) o << ", cp " << s.cp << " (" << s.context_method << "; ZeRO over data x context)";
  o << ", dp " << r.dp << ", activation checkpointing " << s.activation_checkpointing;
  if (r.has_shape) o << ", attention " << s.attention;
  return o.str();
}

}  // namespace

std::string format_estimate(const EstimateResult& r) {
  std::ostringstream o;
  const auto& hw = r.hardware;
  const bool gpu = hw.device == "gpu";
  o << "HW: " << hw.nodes << " node" << (hw.nodes > 1 ? "s" : "") << ", " << hw.gpus_per_node
    << (gpu ? " GPU" : " rank") << (hw.gpus_per_node > 1 ? "s" : "") << " per node";
  if (gpu) o << ", " << format_gib(hw.gpu_memory) << " per GPU";
  o << ", CPU " << (hw.cpu_memory ? format_gib(hw.cpu_memory) : std::string("not given")) << " per node, NVMe "
    << (hw.nvme_capacity ? format_gib(hw.nvme_capacity) : std::string("none")) << " per node\n";
  o << "SW: " << r.model_name << ": " << count_str(r.params) << " params, largest layer "
    << count_str(r.largest_layer_params);
  if (r.shape)
    o << "; " << r.shape->layers << " layers, hidden " << r.shape->hidden << ", " << r.shape->heads << " heads, ffn "
      << r.shape->ffn_dim() << ", vocab " << r.shape->vocab << ", seq " << r.shape->seq_len;
  o << "\n    " << setup_line(r) << "\n\n";

  print_placement(o, gpu ? "Per GPU" + std::string(r.setup.pp > 1 ? " (pipeline stage " + std::to_string(r.activations.stage) + ")" : "") + ":"
                         : "Per rank (CPU device; counted in the node's CPU memory):",
                  r.per_gpu);
  if (r.has_shape && !r.activations.formula.empty())
    o << "  activations per layer: " << format_gib(r.activations.per_layer_full) << " = " << r.activations.formula
      << "\n";
  print_placement(o, "Per node CPU:", r.per_node_cpu);
  if (r.per_node_nvme.total > 0) print_placement(o, "Per node NVMe:", r.per_node_nvme);
  o << "\nVerdict: " << (r.fits ? "fits" : "does NOT fit");
  for (const auto& s : r.shortfalls) o << "\n  " << s;
  o << "\n";
  for (const auto& n : r.notes) o << "note: " << n << "\n";

  if (!r.table.empty()) {
    o << "\nEstimated memory for every ZeRO stage x offload choice (activations included), micro-batch "
      << r.setup.micro_batch << (r.has_shape ? ", activation checkpointing " + r.setup.activation_checkpointing : "")
      << ":\n";
    o << "   per CPU |    per GPU |  per NVMe | states/GPU | activ/GPU | fits | max mb | options\n";
    for (const auto& row : r.table) {
      o << gib_col(row.per_node_cpu, 10) << " |" << gib_col(row.per_gpu, 11) << " |" << gib_col(row.per_node_nvme, 10)
        << " |" << gib_col(row.per_gpu_model_states, 11) << " |" << gib_col(row.per_gpu_activations, 10) << " | "
        << (row.fits ? " yes" : "  no") << " | " << fmt("%6.0f", static_cast<double>(row.max_micro_batch)) << " | "
        << row.label() << (row.validated ? "" : " (design)") << "\n";
    }
    bool any_design = false;
    for (const auto& row : r.table) any_design = any_design || !row.validated;
    if (any_design)
      o << "  (design): a design estimate, not yet validated against the engine (what it does not run yet: NVMe parameter "
           "offload on GPU ranks, tensor/pipeline parallelism)\n";
    if (hw.nvme_capacity == 0) o << "  no NVMe capacity given (--nvme): NVMe offload rows cannot fit\n";
    o << "\nCheapest options that fit, by relative cost per sample (1.00 = forward + backward only; "
         "docs/estimator.md, \"Ranking: the cost model\"):\n";
    if (!r.options_note.empty()) o << "  " << r.options_note << "\n";
    int shown = 0;
    for (const auto& row : r.options) {
      if (++shown > 8) break;
      const OptionCost& c = row.cost;
      o << "  " << shown << ". zero_stage=" << row.zero_stage << ", offload_optimizer=" << row.offload_optimizer
        << ", offload_param=" << row.offload_param;
      if (r.has_shape) o << ", checkpointing " << row.activation_checkpointing << ": micro-batch up to " << row.max_micro_batch;
      else o << ": fits (no activations modelled)";
      o << ", " << format_gib(row.per_gpu) << (gpu ? "/GPU" : "/rank");
      if (c.compute > 0)
        o << "; cost " << fmt("%.2f", c.relative()) << " (recompute +" << fmt("%.2f", c.recompute / c.compute)
          << ", communication +" << fmt("%.2f", c.communication / c.compute) << ", offload +"
          << fmt("%.2f", c.offload / c.compute) << ")";
      else
        o << "; overhead " << fmt("%.1f", c.total() * 1e3) << " ms per sample (communication "
          << fmt("%.1f", c.communication * 1e3) << ", offload " << fmt("%.1f", c.offload * 1e3)
          << "; compute unknown without a shape)";
      o << (row.validated ? "" : " (design estimate)") << "\n";
    }
    if (r.options.size() > 8) o << "  ... " << r.options.size() - 8 << " more (--json lists every one)\n";
    o << "  rates: " << fmt("%g", hw.gpu_tflops) << " TFLOP/s per " << (gpu ? "GPU" : "rank") << ", "
      << fmt("%g", hw.intra_node_gbps) << " GB/s within a node, " << fmt("%g", hw.inter_node_gbps)
      << " GB/s between nodes, host link " << fmt("%g", hw.pcie_gbps) << " GB/s, host memory "
      << fmt("%g", hw.host_memory_gbps) << " GB/s, NVMe " << fmt("%g", hw.nvme_gbps)
      << " GB/s (--gpu-tflops, --intra-node-bw, --inter-node-bw, --pcie-bw, --host-mem-bw, --nvme-bw)\n";
  }
  return o.str();
}

}  // namespace tessera
