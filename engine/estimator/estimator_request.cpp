// Estimator requests as JSON with the CLI's flags as keys (the CLI and tessera.estimate build them).
#include "engine/estimator/estimator.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "engine/config/config_io.h"
#include "engine/estimator/estimator_detail.h"

namespace tessera {

using nlohmann::json;
using namespace estimator_detail;

std::string format_gib(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::abs(b) >= kGiB) return fmt("%.2fGiB", b / kGiB);
  if (std::abs(b) >= 1 << 20) return fmt("%.2fMiB", b / (1 << 20));
  if (std::abs(b) >= 1 << 10) return fmt("%.2fKiB", b / (1 << 10));
  return fmt("%.0fB", b);
}

int64_t parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double value;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    throw std::invalid_argument("not a memory size: \"" + text + "\" (examples: 80, 80GiB, 512MiB, 2TiB)");
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }), unit.end());
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale;
  if (unit.empty() || unit == "g" || unit == "gb" || unit == "gib") scale = double(kGiB);
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = double(kGiB) * 1024;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = double(kGiB) / 1024;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024;
  else if (unit == "b") scale = 1;
  else throw std::invalid_argument("unknown memory unit in \"" + text + "\" (use GiB, MiB, TiB or B)");
  if (!(value >= 0)) throw std::invalid_argument("memory size must be >= 0: \"" + text + "\"");
  return round_bytes(value * scale);
}

TrainingSetup setup_from_config(const Config& c) {
  TrainingSetup s;
  const auto& z = c.zero_optimization;
  s.zero_stage = z.stage;
  s.offload_optimizer = z.offload_optimizer.device;
  s.offload_param = z.offload_param.device;
  s.super_offload = z.offload_optimizer.super_offload;
  s.precision = c.bf16.enabled ? "bf16" : c.fp16.enabled ? "fp16" : "fp32";
  s.async_checkpoint = c.checkpoint.async_save;
  s.grad_accum_dtype = c.data_types.grad_accum_dtype;
  s.communication_dtype = c.communication_data_type.value_or("");
  if (c.optimizer) {
    s.optimizer = c.optimizer->type;
    s.momentum = c.optimizer->params.momentum;
  }
  s.micro_batch = c.train_micro_batch_size_per_gpu.value_or(1);
  s.gradient_accumulation = c.gradient_accumulation_steps.value_or(1);
  s.pipeline_micro_batches = c.pipeline.micro_batches.value_or(0);
  s.pipeline_schedule = c.pipeline.schedule;
  s.virtual_stages = c.pipeline.schedule == "interleaved_1f1b" || c.pipeline.schedule == "zb_v" ? c.pipeline.virtual_stages : 1;
  s.tp = c.tensor_parallel.tp_size;
  s.sequence_parallel = c.tensor_parallel.sequence_parallel;
  s.pp = c.pipeline.stages;
  s.cp = c.context_parallel.size;
  s.context_method = c.context_parallel.method;
  const ActivationCheckpointingConfig ac = c.activation_checkpointing.value_or(ActivationCheckpointingConfig{});
  if (c.pipeline.activation_checkpoint_interval > 0) {
    s.activation_checkpointing = "full";
    s.checkpoint_interval = c.pipeline.activation_checkpoint_interval;
  } else if (ac.partition_activations || ac.cpu_checkpointing || ac.number_checkpoints) {
    s.activation_checkpointing = "full";  // the section only matters to a model that checkpoints
  }
  s.partition_activations = ac.partition_activations;
  s.cpu_checkpointing = ac.cpu_checkpointing;
  static_cast<ZeroSizeParams&>(s) = z;  // the sizes, as the engine reads them (zero/options.h)
  s.optimizer_buffer_count = z.offload_optimizer.buffer_count;
  s.offload_optimizer_ratio = z.offload_optimizer.ratio;
  s.param_buffer_count = z.offload_param.buffer_count;
  s.param_buffer_size = z.offload_param.buffer_size;
  s.moe = c.moe;
  return s;
}

// The training setup's own consistency (estimate() and estimate_inputs_from_json call it).
namespace estimator_detail {
void check_setup(const TrainingSetup& s, int world) {
  auto bad = [](const std::string& m) { throw std::invalid_argument(m); };
  if (s.zero_stage < 0 || s.zero_stage > 3) bad("zero stage must be 0, 1, 2 or 3");
  for (const auto* d : {&s.offload_optimizer, &s.offload_param})
    if (*d != "none" && *d != "cpu" && *d != "nvme") bad("offload device must be none, cpu or nvme, not \"" + *d + "\"");
  if (s.offload_param != "none" && s.zero_stage != 3) bad("offload_param needs ZeRO stage 3");
  if (s.offload_optimizer != "none" && s.zero_stage == 0) bad("offload_optimizer needs ZeRO stage 1, 2 or 3");
  if (s.precision != "fp32" && s.precision != "bf16" && s.precision != "fp16")
    bad("precision must be fp32, bf16 or fp16, not \"" + s.precision + "\"");
  if (s.micro_batch < 1) bad("micro-batch must be >= 1");
  if (s.tp < 1 || s.pp < 1 || s.cp < 1) bad("tensor, pipeline and context degrees must be >= 1");
  if (world % (int64_t(s.tp) * s.pp * s.cp) != 0)
    bad("tp x pp x cp = " + std::to_string(s.tp * s.pp * s.cp) + " does not divide the " + std::to_string(world) + " GPUs");
  if (s.activation_checkpointing != "none" && s.activation_checkpointing != "selective" &&
      s.activation_checkpointing != "full")
    bad("activation checkpointing must be none, selective or full, not \"" + s.activation_checkpointing + "\"");
  if (s.attention != "sdpa" && s.attention != "eager")
    bad("attention must be sdpa or eager, not \"" + s.attention + "\"");
  if (s.param_groups < 0) bad("param_groups must be >= 0");
  if (s.reduce_bucket_size < 1) bad("reduce_bucket_size must be >= 1");
}
}  // namespace estimator_detail

// ---- JSON requests (the CLI's flags as keys) -----------------------------------------------------

namespace {

int64_t memory_of(const json& v, const std::string& key) {
  if (v.is_number()) {
    const double x = v.get<double>();
    if (x < 0) throw std::invalid_argument(key + ": must be >= 0");
    return round_bytes(x * kGiB);  // plain numbers are GiB
  }
  if (v.is_string()) return parse_memory_size(v.get<std::string>());
  throw std::invalid_argument(key + ": a size in GiB (number) or a string such as \"80GiB\"");
}

}  // namespace

json config_json_of(const json& value) {
  if (value.is_object()) return value;
  if (!value.is_string()) throw std::invalid_argument("config: a path, JSON text or an object");
  const std::string& text = value.get_ref<const std::string&>();
  const ConfigSource source = config_source(text);
  try {
    ConfigReport report;
    auto parsed = parse_json_text(source.inline_json ? text : read_text_file(text), source.name, report);
    if (!parsed) throw std::invalid_argument("invalid config " + source.name + ":\n" + report.errors());
    return *parsed;
  } catch (const ConfigError& e) {
    throw std::invalid_argument(e.what());
  }
}

const std::set<std::string>& estimate_request_keys() {
  static const std::set<std::string> known = {
      "params", "largest_layer_params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
      "max_positions", "mlp", "norm", "biases", "tied_embeddings", "dropout", "flash_attention", "preset", "config",
      "zero", "offload_optimizer", "offload_param", "bf16", "fp16", "precision", "optimizer", "micro_batch", "gas",
      "tp", "pp", "pipeline_micro_batches", "sequence_parallel", "activation_checkpointing", "checkpoint_interval",
      "param_groups", "reduce_bucket_size", "gpus_per_node", "nodes", "gpu_mem", "cpu_mem", "nvme", "device",
      "fragmentation", "device_overhead", "host_overhead", "max_micro_batch", "search", "attention", "gpu_tflops",
      "intra_node_bw", "inter_node_bw", "pcie_bw", "host_mem_bw", "nvme_bw", "moe_experts", "moe_every", "moe_k", "ep",
      "moe_capacity_factor", "moe_drop_tokens", "cp", "cp_method"};
  return known;
}

EstimateInputs estimate_inputs_from_json(const json& req) {
  if (!req.is_object()) throw std::invalid_argument("the estimate request must be a JSON object");
  const std::set<std::string>& known = estimate_request_keys();
  for (const auto& [k, v] : req.items()) {
    if (known.count(k)) continue;
    std::string best;
    size_t dist = 4;
    for (const auto& cand : known)
      if (edit_distance(k, cand) < dist) dist = edit_distance(k, cand), best = cand;
    throw std::invalid_argument("unknown estimate option \"" + k + "\"" + (best.empty() ? "" : "; did you mean \"" + best + "\"?"));
  }
  auto get = [&](const char* key) -> const json* { return req.contains(key) && !req[key].is_null() ? &req[key] : nullptr; };
  auto int_of = [&](const char* key) -> std::optional<int64_t> {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) return static_cast<int64_t>(v->get<double>());
    throw std::invalid_argument(std::string(key) + ": an integer, found " + v->dump());
  };
  auto str_of = [&](const char* key) -> std::optional<std::string> {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw std::invalid_argument(std::string(key) + ": a string, found " + v->dump());
    return v->get<std::string>();
  };
  auto bool_of = [&](const char* key) -> std::optional<bool> {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw std::invalid_argument(std::string(key) + ": true or false, found " + v->dump());
    return v->get<bool>();
  };

  EstimateInputs in;
  // Hardware.
  Hardware& hw = in.hardware;
  if (auto d = str_of("device")) hw.device = *d;
  if (auto g = int_of("gpus_per_node")) hw.gpus_per_node = static_cast<int>(*g);
  if (auto n = int_of("nodes")) hw.nodes = static_cast<int>(*n);
  if (hw.gpus_per_node < 1 || hw.nodes < 1) throw std::invalid_argument("gpus_per_node and nodes must be >= 1");
  if (const json* v = get("gpu_mem")) hw.gpu_memory = memory_of(*v, "gpu_mem");
  if (const json* v = get("cpu_mem")) hw.cpu_memory = memory_of(*v, "cpu_mem");
  if (const json* v = get("nvme")) hw.nvme_capacity = memory_of(*v, "nvme");
  if (const json* v = get("fragmentation")) {
    if (!v->is_number()) throw std::invalid_argument("fragmentation: a fraction such as 0.1");
    in.allowance.fragmentation = v->get<double>();
  }
  // The cost model's rates: TFLOP/s and GB/s (10^9 bytes per second), numbers > 0.
  auto rate_of = [&](const char* key, double& field) {
    const json* v = get(key);
    if (!v) return;
    if (!v->is_number() || !(v->get<double>() > 0)) throw std::invalid_argument(std::string(key) + ": a number > 0");
    field = v->get<double>();
  };
  rate_of("gpu_tflops", hw.gpu_tflops);
  rate_of("intra_node_bw", hw.intra_node_gbps);
  rate_of("inter_node_bw", hw.inter_node_gbps);
  rate_of("pcie_bw", hw.pcie_gbps);
  rate_of("host_mem_bw", hw.host_memory_gbps);
  rate_of("nvme_bw", hw.nvme_gbps);
  if (const json* v = get("device_overhead")) in.allowance.device_overhead = memory_of(*v, "device_overhead");
  if (const json* v = get("host_overhead")) in.allowance.host_overhead = memory_of(*v, "host_overhead");
  const int world = hw.gpus_per_node * hw.nodes;

  // Model.
  ModelSpec& model = in.model;
  std::optional<TransformerShape> shape;
  if (auto p = str_of("preset")) {
    auto preset = find_preset(*p);
    if (!preset) {
      std::string names;
      for (const auto& x : model_presets()) names += (names.empty() ? "" : ", ") + x.name;
      throw std::invalid_argument("unknown preset \"" + *p + "\"; presets: " + names);
    }
    model.name = preset->name;
    shape = preset->shape;
  }
  const char* shape_keys[] = {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "max_positions",
                              "mlp", "norm", "biases", "tied_embeddings", "dropout"};
  bool any_shape_key = false;
  for (const char* k : shape_keys) any_shape_key |= get(k) != nullptr;
  if (any_shape_key) {
    if (!shape) {
      std::vector<std::string> missing;
      for (const char* k : {"layers", "hidden", "heads", "vocab", "seq_len"})
        if (!get(k)) missing.push_back(std::string("--") + k);
      if (!missing.empty()) {
        std::string m;
        for (const auto& x : missing) m += (m.empty() ? "" : ", ") + x;
        throw std::invalid_argument("a transformer shape needs " + m + " (or use --preset)");
      }
      shape = TransformerShape{};
    }
    {
      TransformerShape& s = *shape;
      if (auto v = int_of("layers")) s.layers = *v;
      if (auto v = int_of("hidden")) s.hidden = *v;
      if (auto v = int_of("heads")) s.heads = *v;
      if (auto v = int_of("kv_heads")) s.kv_heads = *v;
      if (auto v = int_of("ffn")) s.ffn = *v;
      if (auto v = int_of("vocab")) s.vocab = *v;
      if (auto v = int_of("seq_len")) s.seq_len = *v;
      if (auto v = int_of("max_positions")) s.max_positions = *v;
      if (auto v = str_of("mlp")) s.mlp = *v;
      if (auto v = str_of("norm")) s.norm = *v;
      if (auto v = bool_of("biases")) s.biases = *v;
      if (auto v = bool_of("tied_embeddings")) s.tied_embeddings = *v;
      if (auto v = bool_of("dropout")) s.dropout = *v;
      if (model.name.empty()) model.name = "custom transformer";
      else model.name += " (modified)";
      s.validate();
    }
  }
  model.shape = shape;
  if (auto p = int_of("params")) {
    if (*p < 1) throw std::invalid_argument("params must be >= 1");
    model.params = *p;
  }
  if (auto p = int_of("largest_layer_params")) model.largest_layer_params = *p;
  if (!shape && model.params == 0)
    throw std::invalid_argument(
        "no model: give --params N (with --largest-layer-params for ZeRO-3), a transformer shape (--layers, --hidden, "
        "--heads, --vocab, --seq-len) or --preset");

  // Training setup: the config (a path, JSON text or an object) with the flags merged into it
  // before parsing, so a flag gets the same checks as its key (as `tessera launch` does).
  json cfg = json::object();
  ConfigReport report;
  if (const json* c = get("config")) cfg = config_json_of(*c);
  auto& z = cfg["zero_optimization"];
  if (!z.is_object()) z = json::object();
  if (auto v = int_of("zero")) z["stage"] = *v;
  for (const char* key : {"offload_optimizer", "offload_param"})
    if (auto v = str_of(key)) {
      if (!z[key].is_object()) z[key] = json::object();
      z[key]["device"] = *v;
    }
  for (const char* key : {"offload_optimizer", "offload_param"})
    if (z.contains(key) && z[key].is_object() && z[key].value("device", "none") == "nvme" && !z[key].contains("nvme_path"))
      z[key]["nvme_path"] = "/estimate";  // the path does not change the estimate
  if (auto v = int_of("reduce_bucket_size")) z["reduce_bucket_size"] = *v;
  if (z.empty()) cfg.erase("zero_optimization");
  std::optional<std::string> precision = str_of("precision");
  if (bool_of("bf16").value_or(false)) precision = "bf16";
  if (bool_of("fp16").value_or(false)) {
    if (precision && *precision != "fp16") throw std::invalid_argument("--fp16 and --bf16 (or --precision) contradict");
    precision = "fp16";
  }
  if (precision) {
    if (*precision != "fp32" && *precision != "bf16" && *precision != "fp16")
      throw std::invalid_argument("precision must be fp32, bf16 or fp16, not \"" + *precision + "\"");
    cfg["bf16"] = {{"enabled", *precision == "bf16"}};
    cfg["fp16"] = cfg.contains("fp16") && cfg["fp16"].is_object() ? cfg["fp16"] : json::object();
    cfg["fp16"]["enabled"] = *precision == "fp16";
  }
  if (auto v = str_of("optimizer")) cfg["optimizer"] = {{"type", *v}};
  if (!cfg.contains("optimizer")) cfg["optimizer"] = {{"type", "Adam"}};
  auto mb = int_of("micro_batch"), gas = int_of("gas"), pmb = int_of("pipeline_micro_batches");
  if (pmb) {
    if (gas && *gas != *pmb) throw std::invalid_argument("--pipeline-micro-batches must equal --gas (one micro-batch per accumulation step)");
    gas = pmb;
  }
  if (mb || gas) cfg.erase("train_batch_size");
  if (mb) cfg["train_micro_batch_size_per_gpu"] = *mb;
  if (gas) {
    cfg["gradient_accumulation_steps"] = *gas;
    if (cfg.contains("pipeline") && cfg["pipeline"].is_object()) cfg["pipeline"].erase("micro_batches");
  }
  if (!cfg.contains("train_batch_size") && !cfg.contains("train_micro_batch_size_per_gpu"))
    cfg["train_micro_batch_size_per_gpu"] = 1;
  if (auto v = int_of("tp")) {  // the degree only: the section's sequence_parallel stays
    if (!cfg["tensor_parallel"].is_object()) cfg["tensor_parallel"] = json::object();
    cfg["tensor_parallel"]["tp_size"] = *v;
  }
  if (auto v = int_of("pp")) {
    if (!cfg.contains("pipeline") || !cfg["pipeline"].is_object()) cfg["pipeline"] = json::object();
    cfg["pipeline"]["stages"] = *v;
  }
  if (get("cp") || get("cp_method")) {  // context parallelism: the config's section (its checks)
    if (!cfg.contains("context_parallel") || !cfg["context_parallel"].is_object()) cfg["context_parallel"] = json::object();
    if (auto v = int_of("cp")) cfg["context_parallel"]["size"] = *v;
    if (auto v = str_of("cp_method")) cfg["context_parallel"]["method"] = *v;
  }
  // MoE blocks: the flags into the config's "moe" section (its checks: ep divides the experts and dp).
  if (get("moe_experts") || get("moe_every") || get("moe_k") || get("ep") || get("moe_capacity_factor") ||
      get("moe_drop_tokens")) {
    if (!cfg.contains("moe") || !cfg["moe"].is_object()) cfg["moe"] = json::object();
    json& m = cfg["moe"];
    if (auto v = int_of("moe_experts")) m["num_experts"] = *v;
    if (auto v = int_of("moe_every")) m["every"] = *v;
    if (auto v = int_of("moe_k")) m["k"] = *v;
    if (auto v = int_of("ep")) m["ep_size"] = *v;
    if (const json* v = get("moe_capacity_factor")) m["capacity_factor"] = *v;
    if (auto v = bool_of("moe_drop_tokens")) m["drop_tokens"] = *v;
  }
  Config config = parse_config(cfg, report);
  if (report.ok()) resolve_config(config, world, report);
  if (!report.ok()) throw std::invalid_argument("invalid training setup:\n" + report.errors());
  in.setup = setup_from_config(config);

  TrainingSetup& s = in.setup;
  if (auto v = bool_of("sequence_parallel")) s.sequence_parallel = *v;
  if (const json* v = get("activation_checkpointing")) {
    if (v->is_boolean()) s.activation_checkpointing = v->get<bool>() ? "full" : "none";
    else if (v->is_string()) s.activation_checkpointing = v->get<std::string>();
    else throw std::invalid_argument("activation_checkpointing: none, selective, full, or a boolean");
  }
  if (auto v = int_of("checkpoint_interval")) s.checkpoint_interval = static_cast<int>(*v);
  if (auto v = str_of("attention")) {
    if (*v != "sdpa" && *v != "eager") throw std::invalid_argument("attention: sdpa or eager, not \"" + *v + "\"");
    s.attention = *v;
  }
  if (auto v = bool_of("flash_attention")) {  // legacy spelling: true = sdpa, false = eager
    if (get("attention") && *v != (s.attention == "sdpa"))
      throw std::invalid_argument("flash_attention: " + std::string(*v ? "true" : "false") + " contradicts attention: " +
                                  s.attention);
    s.attention = *v ? "sdpa" : "eager";
  }
  if (auto v = int_of("param_groups")) s.param_groups = static_cast<int>(*v);
  if (auto v = int_of("max_micro_batch")) in.max_micro_batch = *v;
  if (auto v = bool_of("search")) in.search = *v;
  check_setup(s, world);
  return in;
}

json estimate_json(const json& request) { return estimate_to_json(estimate(estimate_inputs_from_json(request))); }

}  // namespace tessera
