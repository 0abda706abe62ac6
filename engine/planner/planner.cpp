#include "engine/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "parallel/pipeline/schedule.h"

namespace tessera::planner {

using nlohmann::json;

namespace {

std::string fmt(const char* format, double x) {
  char text[64];
  std::snprintf(text, sizeof text, format, x);
  return text;
}

// The first error of a report, "<path>: <message>".
std::string first_error(const ConfigReport& report) {
  for (const auto& issue : report.issues)
    if (issue.severity == ConfigIssue::Severity::Error) return issue.path_and_message();
  return "";
}

// Whether the engine runs `layout`: its config passes `tessera config check` (the config's own
// rules, then the keys the engine does not act on yet). Empty: it does; else the first error.
std::string engine_rule(const json& config, int world) {
  ConfigReport report;
  Config parsed = parse_and_resolve_config(config, world, report);
  if (report.ok()) add_engine_support_issues(parsed, report);
  return first_error(report);
}

// The machine's memory, for CPU ranks planned without --cpu-mem.
int64_t machine_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    std::string unit;
    in >> unit;
  }
  return 0;
}

}  // namespace

PlanResult plan(const PlanInputs& in) {
  if (in.global_batch < 1) throw std::invalid_argument("global_batch: the samples per optimizer step, >= 1");
  PlanResult out;
  const Hardware& hw = in.base.hardware;
  out.world = hw.gpus_per_node * hw.nodes;
  out.global_batch = in.global_batch;
  out.calibration = in.calibration;
  // The model as the estimator resolves it (a preset or a shape).
  EstimateInputs probe = in.base;
  probe.search = false;
  const EstimateResult base = estimate(probe);
  if (!base.shape) throw std::invalid_argument("the planner times a transformer: give a preset or its shape (layers, hidden, heads, vocab, seq_len)");
  out.model = base.model_name;
  const TransformerShape shape = *base.shape;

  std::vector<Layout> layouts = enumerate_layouts(out.world, hw.gpus_per_node, in.global_batch, shape, in.limits,
                                                  &out.rejected);
  out.considered = int(layouts.size() + out.rejected.size());
  struct Fitting {
    Layout layout;
    json config;
    EstimateResult memory;
  };
  std::vector<Fitting> fitting;  // the engine runs them and they fit: timed next
  for (const Layout& l : layouts) {
    json config = as_config(l, in.base_config, shape.layers, in.nvme_path);
    const std::string unsupported = engine_rule(config, out.world);
    if (!unsupported.empty()) {
      out.rejected.push_back({l, unsupported, "unsupported"});
      continue;
    }
    EstimateInputs one = in.base;
    one.search = false;
    one.setup = apply(l, in.base.setup);
    EstimateResult memory;
    try {
      memory = estimate(one);
    } catch (const std::invalid_argument& e) {
      out.rejected.push_back({l, e.what(), "unsupported"});
      continue;
    }
    if (!memory.fits) {
      out.rejected.push_back({l, memory.shortfalls.empty() ? "does not fit" : memory.shortfalls.front(), "memory"});
      continue;
    }
    fitting.push_back({l, std::move(config), std::move(memory)});
  }
  // The probe times every layer shape these layouts give a rank, together (calibration.h).
  std::vector<LayerShape> shapes;
  for (const Fitting& f : fitting) shapes.push_back(layer_shape(f.layout, shape));
  in.calibration.time_layers(shapes);
  for (Fitting& f : fitting) {
    Candidate c;
    c.layout = f.layout;
    c.cost = predict_step(f.layout, f.memory, in.calibration);
    c.per_rank_bytes = f.memory.per_gpu.total;
    c.per_node_cpu_bytes = f.memory.per_node_cpu.total;
    c.samples_per_second = double(in.global_batch) / c.cost.total();
    c.config = std::move(f.config);
    out.ranked.push_back(std::move(c));
  }
  out.calibration = in.calibration;  // with the shapes the probe timed
  in.calibration.save();
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const Candidate& a, const Candidate& b) {
    const double ta = a.cost.total(), tb = b.cost.total();
    if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
    // Equal predictions: the larger micro-batch (fewer micro-steps, each with its fixed costs
    // the model leaves out), then less memory.
    if (a.layout.micro_batch != b.layout.micro_batch) return a.layout.micro_batch > b.layout.micro_batch;
    return a.per_rank_bytes < b.per_rank_bytes;
  });
  if (in.calibration.device == "cpu" && in.calibration.core_share() < 1)
    out.notes.push_back(std::to_string(in.calibration.ranks_per_node) + " ranks share " +
                        std::to_string(in.calibration.cores_per_node) + " cores: compute is timed at " +
                        fmt("%.2f", in.calibration.core_share()) + " of a core per rank, the pipeline with the cores shared among its busy ranks");
  out.notes.push_back("the data term counts what the compute cannot hide of the collectives the engine overlaps; a pipeline "
                      "is timed with its schedule; times are predictions (docs/planner.md)");
  return out;
}

// ---- reports -------------------------------------------------------------------------------------

namespace {

// Why a fitting layout lost to the best: the term it spends the most more on.
std::string why_slower(const StepCost& c, const StepCost& best) {
  const std::pair<const char*, double> extra[] = {
      {"compute", c.compute - best.compute}, {"recomputation", c.recompute - best.recompute},
      {"tensor-parallel communication", c.tensor - best.tensor}, {"context-parallel communication", c.context - best.context},
      {"expert all-to-alls", c.experts - best.experts},
      {"pipeline bubble", c.bubble - best.bubble}, {"pipeline sends", c.p2p - best.p2p},
      {"data-parallel communication", c.data - best.data}, {"optimizer step", c.optimizer - best.optimizer},
      {"offload traffic", c.offload - best.offload}};
  const char* name = "compute";
  double most = -1e300;
  for (const auto& [n, v] : extra)
    if (v > most) most = v, name = n;
  return name;
}

size_t text_columns(const std::string& text) {
  size_t columns = 0;
  for (unsigned char ch : text) columns += (ch & 0xC0) != 0x80;  // UTF-8: continuation bytes take no column
  return columns;
}

std::string pad_columns(const std::string& text, size_t width) {
  const size_t columns = text_columns(text);
  return text + std::string(width > columns ? width - columns : 0, ' ');
}

std::map<std::string, int> counts_by_kind(const PlanResult& r) {
  std::map<std::string, int> counts;
  for (const auto& x : r.rejected) counts[x.kind]++;
  return counts;
}

}  // namespace

json plan_to_json(const PlanResult& r, int top) {
  json j;
  j["model"] = r.model;
  j["world"] = r.world;
  j["global_batch"] = r.global_batch;
  j["considered"] = r.considered;
  j["feasible"] = r.ranked.size();
  j["calibration"] = r.calibration.to_json();
  j["notes"] = r.notes;
  json ranked = json::array();
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const Candidate& c = r.ranked[i];
    json x = {{"rank", i + 1},
              {"layout", to_json(c.layout)},
              {"step_seconds", c.cost.total()},
              {"samples_per_second", c.samples_per_second},
              {"per_rank_bytes", c.per_rank_bytes},
              {"per_node_cpu_bytes", c.per_node_cpu_bytes},
              {"terms", c.cost.to_json()}};
    if (i > 0) x["slower_by"] = why_slower(c.cost, r.ranked.front().cost);
    if (int(i) < top) x["config"] = c.config;
    ranked.push_back(std::move(x));
  }
  j["ranked"] = std::move(ranked);
  json rejected = json::array();
  for (const auto& x : r.rejected) rejected.push_back({{"layout", to_json(x.layout)}, {"kind", x.kind}, {"reason", x.reason}});
  j["rejected"] = std::move(rejected);
  j["rejected_by_kind"] = counts_by_kind(r);
  if (!r.ranked.empty()) j["best"] = r.ranked.front().config;
  return j;
}

std::string format_plan(const PlanResult& r, int top) {
  std::ostringstream out;
  out << "tessera plan: " << r.model << " on " << r.world << (r.calibration.device == "cpu" ? " CPU rank" : " GPU")
      << (r.world == 1 ? "" : "s") << ", global batch " << r.global_batch << "\n";
  out << "calibration:\n" << r.calibration.describe();
  out << r.considered << " layouts considered, " << r.ranked.size() << " fit and run\n\n";
  if (r.ranked.empty()) {
    out << "nothing fits\n";
  } else {
    const StepCost& best = r.ranked.front().cost;
    // The layout column is as wide as the widest label shown, counted in characters: the labels'
    // "·" and "×" are two bytes each, which printf's %-58s would count as two columns.
    const int shown = std::min<int>(top, int(r.ranked.size()));
    size_t width = std::string("layout").size();
    for (int i = 0; i < shown; ++i) width = std::max(width, text_columns(r.ranked[i].layout.label()));
    char numbers[128];
    std::snprintf(numbers, sizeof numbers, " %10s %10s %10s  ", "step (s)", "samples/s", "memory");
    out << pad_columns("#", 4) << " " << pad_columns("layout", width) << numbers << "largest term after compute\n";
    for (int i = 0; i < shown; ++i) {
      const Candidate& c = r.ranked[i];
      std::snprintf(numbers, sizeof numbers, " %10.4f %10.2f %10s  ", c.cost.total(), c.samples_per_second,
                    format_gib(c.per_rank_bytes).c_str());
      out << pad_columns(std::to_string(i + 1), 4) << " " << pad_columns(c.layout.label(), width) << numbers
          << c.cost.bound() << "\n";
    }
    out << "\nwhy the rest lost:\n";
    std::map<std::string, int> slower;
    for (size_t i = 1; i < r.ranked.size(); ++i) slower[why_slower(r.ranked[i].cost, best)]++;
    for (const auto& [why, n] : slower) out << "  " << n << " slower, most of it " << why << "\n";
  }
  std::map<std::string, const Rejection*> example;
  for (const auto& x : r.rejected)
    if (!example.count(x.kind)) example[x.kind] = &x;
  const std::map<std::string, std::string> words = {{"shape", "the model's shape rules them out"},
                                                    {"batch", "the global batch does not divide"},
                                                    {"unsupported", "the engine does not run them"},
                                                    {"memory", "do not fit"}};
  for (const auto& [kind, n] : counts_by_kind(r)) {
    const Rejection& x = *example[kind];
    out << "  " << n << " " << (words.count(kind) ? words.at(kind) : kind) << ", e.g. " << x.layout.label() << ": "
        << x.reason << "\n";
  }
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  if (!r.ranked.empty()) out << "\nbest config:\n" << r.ranked.front().config.dump(2) << "\n";
  return out.str();
}

// ---- requests ------------------------------------------------------------------------------------

namespace {

// Every key of a plan request is the planner's own or an estimate request's; the accumulation
// steps are derived, not given. Unknown keys name the nearest known one.
void check_plan_keys(const json& request) {
  static const std::set<std::string> own = {"global_batch", "measure", "calibration_cache", "cores_per_node",
                                            "collective_latency_us", "device_memory_bw", "overlap_exposed", "emulated_hosts", "max_tp", "offload",
                                            "cp_search", "nvme_path", "schedule", "virtual_stages"};
  static const std::set<std::string> derived = {"gas", "pipeline_micro_batches"};
  static const std::set<std::string> not_planned = {"search", "max_micro_batch"};  // the estimator's search
  for (const auto& [key, value] : request.items()) {
    if (derived.count(key))
      throw std::invalid_argument(key + ": derived by the planner (global_batch / (micro_batch x dp)); fix micro_batch instead");
    if (own.count(key) || (estimate_request_keys().count(key) && !not_planned.count(key))) continue;
    std::string best;
    size_t distance = 4;
    for (const auto* keys : {&own, &estimate_request_keys()})
      for (const auto& candidate : *keys)
        if (edit_distance(key, candidate) < distance) distance = edit_distance(key, candidate), best = candidate;
    throw std::invalid_argument("unknown plan option \"" + key + "\"" + (best.empty() ? "" : "; did you mean \"" + best + "\"?"));
  }
}

// The config a plan's layouts are written into: the request's (path, text or object) without the
// keys the planner decides, with its precision and optimizer flags; an offload nvme_path it has
// goes to `nvme_path` unless the request gives one.
json base_config_of(const json& request, std::string* nvme_path) {
  json config = request.contains("config") && !request["config"].is_null() ? config_json_of(request["config"]) : json::object();
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                          "sequence_parallel_size", "activation_checkpointing"})
    config.erase(key);
  // The degrees are the planner's; how the model splits its work is the model's, kept (and
  // estimated with): tensor_parallel.sequence_parallel (or the request's "sequence_parallel"),
  // context_parallel.method.
  for (const auto& [section, keys] : {std::pair<const char*, std::vector<const char*>>{"tensor_parallel", {"tp_size", "autotp_size"}},
                                      {"context_parallel", {"size"}}})
    if (config.contains(section) && config[section].is_object())
      for (const char* key : keys) config[section].erase(key);
  if (request.value("sequence_parallel", false)) config["tensor_parallel"]["sequence_parallel"] = true;
  if (config.contains("zero_optimization") && config["zero_optimization"].is_object()) {
    json& z = config["zero_optimization"];
    for (const char* key : {"offload_optimizer", "offload_param"})
      if (z.contains(key) && z[key].is_object() && z[key].contains("nvme_path") && !request.contains("nvme_path"))
        *nvme_path = z[key]["nvme_path"];
    for (const char* key : {"stage", "offload_optimizer", "offload_param"}) z.erase(key);
  }
  if (config.contains("pipeline") && config["pipeline"].is_object())
    for (const char* key : {"stages", "micro_batches", "activation_checkpoint_interval", "schedule", "virtual_stages"})
      config["pipeline"].erase(key);
  if (config.contains("moe") && config["moe"].is_object()) config["moe"].erase("ep_size");
  const std::string precision = request.value("bf16", false) ? "bf16" : request.value("fp16", false) ? "fp16"
                                                                                                    : request.value("precision", "");
  if (!precision.empty())
    for (const char* section : {"bf16", "fp16"}) {
      const bool on = precision == section;
      if (!on && !config.contains(section)) continue;  // off by default: not written
      if (!config[section].is_object()) config[section] = json::object();
      config[section]["enabled"] = on;
    }
  if (request.contains("optimizer") && request["optimizer"].is_string()) config["optimizer"] = {{"type", request["optimizer"]}};
  if (!config.contains("optimizer")) config["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}};
  return config;
}

}  // namespace

PlanInputs plan_inputs_from_json(const json& request) {
  if (!request.is_object()) throw std::invalid_argument("the plan request must be a JSON object");
  check_plan_keys(request);
  json req = request;
  PlanInputs in;
  auto take = [&](const char* key) -> std::optional<json> {
    if (!req.contains(key) || req[key].is_null()) {
      req.erase(key);
      return std::nullopt;
    }
    json v = req[key];
    req.erase(key);
    return v;
  };
  auto integer = [](const json& v, const char* key) {
    if (!v.is_number_integer()) throw std::invalid_argument(std::string(key) + ": an integer, found " + v.dump());
    return v.get<int64_t>();
  };
  auto string = [](const json& v, const char* key) {
    if (!v.is_string()) throw std::invalid_argument(std::string(key) + ": a string, found " + v.dump());
    return v.get<std::string>();
  };
  auto boolean = [](const json& v, const char* key) {
    if (!v.is_boolean()) throw std::invalid_argument(std::string(key) + ": true or false, found " + v.dump());
    return v.get<bool>();
  };
  // The planner's own keys.
  const auto batch = take("global_batch");
  if (!batch) throw std::invalid_argument("global_batch: the samples per optimizer step (train_batch_size) is required");
  in.global_batch = integer(*batch, "global_batch");
  if (in.global_batch < 1) throw std::invalid_argument("global_batch: must be >= 1");
  const bool measure = take("measure").value_or(false).get<bool>();
  const std::string cache = take("calibration_cache").value_or(json(default_calibration_cache())).get<std::string>();
  for (const char* key : {"cores_per_node", "collective_latency_us", "device_memory_bw"})  // Calibration::from reads them
    if (auto v = take(key); v && (!v->is_number() || !(v->get<double>() > 0)))
      throw std::invalid_argument(std::string(key) + ": a number > 0");
  if (auto v = take("emulated_hosts"); v && !v->is_boolean())
    throw std::invalid_argument("emulated_hosts: true or false (the nodes are scripts/cluster.sh's hosts of this machine)");
  if (auto v = take("overlap_exposed"); v && (!v->is_number() || v->get<double>() < 0 || v->get<double>() > 1))
    throw std::invalid_argument("overlap_exposed: a number from 0 (overlapped collectives hidden) to 1 (paid in full)");
  if (auto v = take("max_tp")) in.limits.max_tp = int(integer(*v, "max_tp"));
  if (auto v = take("offload")) in.limits.offload = boolean(*v, "offload");
  if (auto v = take("cp_search")) in.limits.context_parallel = boolean(*v, "cp_search");
  if (auto v = take("nvme_path")) in.nvme_path = string(*v, "nvme_path");
  // The layout's keys fix that choice.
  if (auto v = take("zero")) in.limits.zero_stage = int(integer(*v, "zero"));
  if (auto v = take("tp")) in.limits.tp = int(integer(*v, "tp"));
  if (auto v = take("pp")) in.limits.pp = int(integer(*v, "pp"));
  if (auto v = take("cp")) in.limits.cp = int(integer(*v, "cp"));
  if (auto v = take("schedule")) in.limits.schedule = string(*v, "schedule");
  if (auto v = take("virtual_stages")) {
    in.limits.virtual_stages = int(integer(*v, "virtual_stages"));
    if (in.limits.virtual_stages < 2) throw std::invalid_argument("virtual_stages: the interleaved schedule's model chunks a stage, >= 2");
  }
  if (in.limits.schedule) {
    const auto& names = pipeline::schedule_names();
    if (std::find(names.begin(), names.end(), *in.limits.schedule) == names.end())
      throw std::invalid_argument("schedule: one of the pipeline schedules (parallel/pipeline/schedule.h), got \"" +
                                  *in.limits.schedule + "\"");
  }
  const std::optional<json> ep = take("ep");
  if (ep) in.limits.ep = int(integer(*ep, "ep"));
  if (auto v = take("micro_batch")) in.limits.micro_batch = integer(*v, "micro_batch");
  if (auto v = take("offload_optimizer")) in.limits.offload_optimizer = string(*v, "offload_optimizer");
  if (auto v = take("offload_param")) in.limits.offload_param = string(*v, "offload_param");
  if (auto v = take("activation_checkpointing"))
    in.limits.activation_checkpointing = v->is_boolean() ? (v->get<bool>() ? "full" : "none") : string(*v, "activation_checkpointing");
  // The base config: the request's, its layout keys left to the planner.
  in.base_config = base_config_of(request, &in.nvme_path);
  if (req.contains("cp_method") && req["cp_method"].is_string()) in.limits.context_method = req["cp_method"];
  else if (in.base_config.contains("context_parallel") && in.base_config["context_parallel"].contains("method"))
    in.limits.context_method = in.base_config["context_parallel"]["method"];
  req.erase("config");

  // The model and the hardware, as `tessera estimate` reads them.
  json estimate_request = req;
  estimate_request.erase("bf16"), estimate_request.erase("fp16"), estimate_request.erase("precision"),
      estimate_request.erase("optimizer");
  estimate_request["config"] = in.base_config;
  estimate_request["search"] = false;
  if (estimate_request.value("device", "gpu") == "cpu" && !estimate_request.contains("cpu_mem")) {
    const int64_t memory = machine_memory();
    if (memory > 0) estimate_request["cpu_mem"] = format_gib(memory);
  }
  in.base = estimate_inputs_from_json(estimate_request);
  // An MoE model (the config's "moe" section or the moe_* keys): ep is searched, and the layouts'
  // configs carry the section as the estimator resolved it.
  if (const auto& moe = in.base.setup.moe) {
    in.limits.num_experts = moe->num_experts;
    json& section = in.base_config["moe"];
    if (!section.is_object()) section = json::object();
    section["num_experts"] = moe->num_experts, section["every"] = moe->every, section["k"] = moe->k;
    section["capacity_factor"] = moe->capacity_factor, section["drop_tokens"] = moe->drop_tokens;
    section.erase("ep_size");
  } else if (ep) {
    throw std::invalid_argument("ep: the model has no MoE layers (give moe_experts, or a config with a \"moe\" section)");
  }
  in.limits.nvme = in.base.hardware.nvme_capacity > 0;  // NVMe offload only with a drive
  EstimateInputs probe = in.base;
  probe.search = false;
  const EstimateResult resolved = estimate(probe);
  in.calibration = Calibration::from(resolved.hardware, in.base.setup.precision, request,
                                     measure, cache);
  return in;
}

json plan_json(const json& request, int top) { return plan_to_json(plan(plan_inputs_from_json(request)), top); }

}  // namespace tessera::planner
