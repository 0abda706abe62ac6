// The memory estimator (engine/estimator/estimator.h). docs/estimator.md states every formula used here.
#include "engine/estimator/estimator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/config/config_io.h"
#include "engine/estimator/estimator_detail.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"
#include "zero/flat_layout.h"

namespace tessera {

using nlohmann::json;

namespace estimator_detail {

int64_t round_bytes(double x) { return static_cast<int64_t>(std::llround(x)); }

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

std::string count_str(int64_t n) {  // 6738415616 -> "6.74B", 131072000 -> "131.1M"
  if (n >= 1000000000) return fmt("%.2fB", n / 1e9);
  if (n >= 1000000) return fmt("%.1fM", n / 1e6);
  if (n >= 10000) return fmt("%.1fK", n / 1e3);
  return std::to_string(n);
}

}  // namespace estimator_detail

using namespace estimator_detail;

namespace {

// Offload choices from least to most offloaded (the search's cost order).
int offload_level(const std::string& opt, const std::string& param) {
  static const std::map<std::pair<std::string, std::string>, int> levels = {
      {{"none", "none"}, 0}, {{"cpu", "none"}, 1}, {{"cpu", "cpu"}, 2},
      {{"nvme", "none"}, 3}, {{"nvme", "cpu"}, 4}, {{"cpu", "nvme"}, 5}, {{"nvme", "nvme"}, 6}};
  auto it = levels.find({opt, param});
  return it == levels.end() ? 7 : it->second;
}

// ---- the resolved model --------------------------------------------------------------------

struct Resolved {
  std::string name;
  std::optional<TransformerShape> shape;
  std::vector<ParamTensor> tensors;  // empty: a bare parameter count
  int64_t params = 0, largest = 0;
  bool explicit_tensors = false;
  Hardware hw;
  Allowance al;
  int world = 1;
};

// The micro-batches stage `stage` holds at its peak under the setup's schedule (the simulator's
// count; an interleaved schedule's chunks, each 1/v of the stage, rounded up to whole ones).
int64_t pipeline_in_flight(const TrainingSetup& s, int stage, int64_t micro_batches) {
  if (s.pipeline_schedule == "1f1b" || s.pipeline_schedule.empty())
    return std::max<int64_t>(1, std::min<int64_t>(s.pp - stage, micro_batches));
  const pipeline::Schedule schedule =
      pipeline::make_schedule(s.pipeline_schedule, s.pp, int(micro_batches), s.virtual_stages);
  const int peak = pipeline::simulate(schedule).peak_activations.at(stage);
  return std::max<int64_t>(1, (peak + schedule.chunks - 1) / schedule.chunks);
}

std::pair<int64_t, int64_t> stage_layers(int64_t layers, int pp, int stage) {  // first layer, count
  const int64_t base = layers / pp, extra = layers % pp;
  const int64_t count = base + (stage < extra ? 1 : 0);
  const int64_t first = stage * base + std::min<int64_t>(stage, extra);
  return {first, count};
}

StageModel stage_model(const Resolved& r, const TrainingSetup& s, int stage) {
  StageModel m;
  m.first = stage == 0;
  // The head and the loss: the last stage's, or stage 0's under zb_v (its V ends where it began).
  m.last = stage == pipeline::ChunkLayout{s.pp, s.virtual_stages, pipeline::placement_of(s.pipeline_schedule)}.last_stage();
  int64_t first_layer = 0, count = 0;
  if (r.shape) std::tie(first_layer, count) = stage_layers(r.shape->layers, s.pp, stage);
  m.layers = count;
  if (r.tensors.empty()) {  // a bare count: Ψ/(tp·pp), in bucket-sized pieces of one group
    const int64_t local = ceil_div(r.params, int64_t(s.tp) * s.pp);
    // Pieces of one bucket each (at most 65536 of them: beyond, buckets grow, conservatively).
    const int64_t piece = std::max({int64_t(1), std::min(local, s.reduce_bucket_size), ceil_div(local, 65536)});
    for (int64_t done = 0; done < local; done += piece) {
      ParamTensor t;
      t.name = "params";
      t.numel = std::min(piece, local - done);
      m.tensors.push_back(t);
    }
    m.params = local;
    m.largest = ceil_div(r.largest, s.tp);
    return m;
  }
  std::map<int, int64_t> modules;
  for (const auto& t : r.tensors) {
    bool here;
    if (t.tied_copy) here = s.pp > 1 && m.last;  // with pp = 1 the head is the embedding itself
    else if (t.layer == -1) here = m.first;
    else if (t.layer == -2) here = m.last;
    else here = t.layer >= first_layer && t.layer < first_layer + count;
    // An expert is held by the ep rank of its index (the estimate is ep rank 0's: each holds as many).
    if (t.expert >= 0 && s.moe && t.expert >= s.moe->num_experts / s.moe->ep_size) here = false;
    if (!here) continue;
    ParamTensor local = t;
    if (t.tp_split) local.numel = ceil_div(t.numel, s.tp);
    m.params += local.numel;
    if (local.module >= 0) m.largest = std::max(m.largest, modules[local.module] += local.numel);
    else m.largest = std::max(m.largest, local.numel);
    m.tensors.push_back(local);
  }
  if (r.explicit_tensors && r.largest > 0) m.largest = ceil_div(r.largest, s.tp);
  return m;
}

// ---- one configuration ---------------------------------------------------------------------

struct Evaluation {
  Placement gpu, cpu, nvme;
  ActivationDetail act;
  int64_t params_per_gpu = 0;
  bool validated = false;
};

void add_line(Placement& p, const std::string& name, int64_t bytes, const std::string& detail) {
  if (bytes == 0) return;
  p.lines.push_back({name, bytes, detail});
}

int64_t line_sum(const Placement& p) {
  int64_t sum = 0;
  for (const auto& l : p.lines) sum += l.bytes;
  return sum;
}

void finish(Placement& p, int64_t construction, const std::string& construction_why, double fragmentation,
            int64_t overhead, const std::string& overhead_name, int64_t capacity, bool check) {
  const int64_t steady = line_sum(p);
  const int64_t peak = std::max(steady, construction);
  p.steady = steady;
  p.construction = construction;
  if (construction > steady)
    p.lines.push_back({"construction peak (transient)", 0,
                       format_gib(construction) + (steady > 0 ? " (> steady state " + format_gib(steady) + ")" : "") +
                           ": " + construction_why});
  const int64_t frag = round_bytes(peak * fragmentation);
  p.allowance = frag + overhead;
  if (frag > 0) p.lines.push_back({"fragmentation allowance", frag, fmt("%g%%", fragmentation * 100)});
  if (overhead > 0) p.lines.push_back({"framework", overhead, overhead_name});
  p.total = peak + p.allowance;
  p.capacity = capacity;
  p.check = check;
}

Evaluation evaluate_stage(const Resolved& r, const TrainingSetup& s, int dp, int stage) {
  Evaluation ev;
  const StageModel m = stage_model(r, s, stage);
  ev.params_per_gpu = m.params;
  const bool cpu_device = r.hw.device == "cpu";
  const States st = model_states(m, s, dp, cpu_device);
  const int ranks = r.hw.gpus_per_node;

  // Activations of this stage.
  ActivationDetail& ad = ev.act;
  ad.stage = stage;
  int64_t act_device = 0;
  if (r.shape) {
    const Activations a = activation_terms(*r.shape, s, s.micro_batch);
    const int64_t m_batches = s.pipeline_micro_batches > 0 ? s.pipeline_micro_batches : s.gradient_accumulation;
    ad.in_flight = s.pp > 1 ? pipeline_in_flight(s, stage, m_batches) : 1;
    ad.layers_held = m.layers;
    ad.per_layer_full = a.layer_full;
    ad.formula = a.formula;
    // The stage's MoE layers store more than a dense one (a.moe_extra each).
    int64_t moe_layers = 0;
    if (s.moe) {
      const auto [first_layer, count] = stage_layers(r.shape->layers, s.pp, stage);
      for (int64_t l = first_layer; l < first_layer + count; ++l) moe_layers += (l + 1) % s.moe->every == 0;
      ad.moe_layers = moe_layers;
      ad.moe_extra = a.moe_extra;
      ad.moe_all_to_all = moe_layers > 0 ? a.moe_all_to_all : 0;
      ad.moe_rows = a.moe_rows;
    }
    ad.context_extra = a.context_extra;
    ad.context_buffers = a.context_buffers;
    int64_t stored;
    if (s.activation_checkpointing == "full") {
      const int64_t interval = std::max(1, s.checkpoint_interval);
      const int64_t checkpoints = ceil_div(m.layers, interval);
      ad.per_layer = a.checkpoint;
      stored = ad.in_flight * checkpoints * a.checkpoint;
      ad.recompute = std::min<int64_t>(interval, m.layers) * a.layer_full + std::min<int64_t>(interval, moe_layers) * a.moe_extra;
    } else {
      ad.per_layer = a.layer_stored;
      stored = ad.in_flight * (m.layers * a.layer_stored + moe_layers * a.moe_extra);
    }
    if (s.cpu_checkpointing && s.activation_checkpointing == "full") {
      ad.on_cpu = stored;
      stored = 0;
    }
    ad.embedding = m.first ? ad.in_flight * a.embedding : 0;
    ad.logits = m.last ? a.output : 0;
    // The output layer's backward (logits and their gradient) runs before any layer is
    // recomputed, and its buffers are freed by then: the two peaks do not add.
    act_device = stored + ad.embedding + std::max({ad.logits, ad.recompute, ad.moe_all_to_all, ad.context_buffers});
  }

  // Per GPU (per rank on a CPU device).
  Placement& g = ev.gpu;
  add_line(g, "parameters", st.params, st.params_detail);
  add_line(g, "fp32 master weights", st.master, st.master_detail);
  add_line(g, "gradients", st.grads, st.grads_detail);
  add_line(g, "optimizer states", st.optim, st.optim_detail);
  g.model_states = st.params + st.master + st.grads + st.optim;
  add_line(g, "gathered parameters (ZeRO-3)", st.gathered, st.gathered_detail);
  add_line(g, "communication buckets", st.buckets, st.buckets_detail);
  g.buffers = st.buckets + st.gathered;
  if (r.shape) {
    std::string detail = std::to_string(ad.layers_held) + " layers";
    if (ad.in_flight > 1) detail += " x " + std::to_string(ad.in_flight) + " micro-batches in flight";
    detail += (s.activation_checkpointing == "full" ? " (checkpointed inputs)" : "");
    if (ad.logits && ad.recompute)
      detail += " + max(output layer " + format_gib(ad.logits) + ", 1 recomputed segment " + format_gib(ad.recompute) + ")";
    else if (ad.recompute) detail += " + 1 recomputed segment " + format_gib(ad.recompute);
    else if (ad.logits) detail += " + output layer " + format_gib(ad.logits);
    if (ad.moe_layers)
      detail += "; " + std::to_string(ad.moe_layers) + " MoE layers store " + format_gib(ad.moe_extra) +
                " more each (" + std::to_string(ad.moe_rows) + " expert rows), their all-to-all buffers " +
                format_gib(ad.moe_all_to_all) + " (transient: the larger of it and the output layer counts)";
    if (s.cp > 1)
      detail += "; context parallelism (" + s.context_method + ", " + std::to_string(s.cp) + " ranks): seq_len/" +
                std::to_string(s.cp) + " tokens a rank, " + format_gib(ad.context_extra) + " more a layer, " +
                (s.context_method == "ring" ? "key/value blocks in flight " : "all-to-all buffers ") +
                format_gib(ad.context_buffers) + " (transient)";
    add_line(g, "activations", act_device, detail);
  }
  g.activations = act_device;
  const int64_t device_overhead = cpu_device ? 0 : r.al.device_overhead;
  // ZeRO-3 with offload is a design that builds modules partitioned (zero.Init); without offload the
  // engine is built whole (every bucket gathered) and releases at the first unit.
  const bool partitioned_build = s.zero_stage == 3 && (s.offload_optimizer != "none" || s.offload_param != "none");
  finish(g, st.construction,
         partitioned_build ? "modules built partitioned (zero.Init-like)"
                           : "the engine copies each group into an fp32 flat buffer beside the model's own fp32 tensors",
         r.al.fragmentation, device_overhead, "CUDA context, cuBLAS/NCCL workspaces", cpu_device ? 0 : r.hw.gpu_memory,
         !cpu_device);

  // Per node CPU: every rank of the node (ranks of one node are assumed to hold the busiest stage).
  Placement& c = ev.cpu;
  if (cpu_device) {
    for (const auto& l : g.lines)
      if (l.name != "fragmentation allowance" && l.name != "framework" && l.bytes > 0)
        add_line(c, l.name, ranks * l.bytes, std::to_string(ranks) + " ranks x " + format_gib(l.bytes));
    c.model_states = ranks * g.model_states;
    c.activations = ranks * g.activations;
    c.buffers = ranks * g.buffers;
  }
  const std::string per = std::to_string(ranks) + " ranks";
  add_line(c, cpu_device ? "offloaded parameters" : "parameters (offloaded)", ranks * st.h_params, per);
  add_line(c, cpu_device ? "offloaded fp32 master weights" : "fp32 master weights (offloaded)", ranks * st.h_master, per);
  add_line(c, cpu_device ? "offloaded gradients" : "gradients (offloaded, fp32)", ranks * st.h_grads, per);
  add_line(c, cpu_device ? "offloaded optimizer states" : "optimizer states (offloaded)", ranks * st.h_optim, per);
  add_line(c, "pinned swap buffers", ranks * st.h_pinned, st.h_pinned_detail);
  add_line(c, "checkpointed activations", ranks * ad.on_cpu, "cpu_checkpointing");
  // checkpoint.async_save: while a save is written, each rank's saved tensors wait in host memory
  // (engine/checkpoint/background_save.h): its fp32 values (and compute copy under mixed
  // precision) and optimizer state; at ZeRO 0 data rank 0 saves the whole replica.
  const int64_t saved_elements = s.zero_stage == 0 ? m.params : (m.params + dp - 1) / dp;
  const int64_t async_copy = s.async_checkpoint ? saved_elements * (s.precision == "fp32" ? 4 : 6) + st.optim +
                                                      st.h_optim + st.n_optim
                                                : 0;
  add_line(c, "async checkpoint copy", ranks * async_copy, per + " x the saved state (checkpoint.async_save)");
  c.model_states += ranks * (st.h_params + st.h_master + st.h_grads + st.h_optim);
  c.buffers += ranks * (st.h_pinned + async_copy);
  c.activations += ranks * ad.on_cpu;
  // Construction on the host: each rank builds its model in fp32 before moving it to the GPU
  // (DeepSpeed's 4·P·gpus_per_node term); ZeRO-3 builds it partitioned (zero.Init).
  int64_t host_construction = 0;
  if (cpu_device) host_construction = ranks * st.construction;
  else host_construction = ranks * (partitioned_build ? 4 * m.largest : 4 * m.params);
  const int64_t host_overhead = int64_t(ranks) * r.al.host_overhead;
  finish(c, host_construction,
         cpu_device ? "the engine's construction on every rank"
                    : (partitioned_build ? "each rank builds its largest module in fp32 on the host"
                                         : "each rank builds its model in fp32 on the host before moving it to the GPU"),
         r.al.fragmentation, host_overhead, per + " x " + format_gib(r.al.host_overhead) + " (process, libraries)",
         r.hw.cpu_memory, r.hw.cpu_memory > 0);

  // Per node NVMe.
  Placement& n = ev.nvme;
  add_line(n, "parameters", ranks * st.n_params, per);
  add_line(n, "fp32 master weights", ranks * st.n_master, per);
  add_line(n, "gradients (fp32)", ranks * st.n_grads, per);
  add_line(n, "optimizer states", ranks * st.n_optim, per);
  n.model_states = line_sum(n);
  finish(n, 0, "", 0.0, 0, "", r.hw.nvme_capacity, true);  // no capacity given: no NVMe

  ev.validated = engine_runs(s, cpu_device);
  return ev;
}

// The busiest pipeline stage decides (largest per-GPU total; ties: larger host total).
Evaluation evaluate(const Resolved& r, const TrainingSetup& s) {
  const int dp = r.world / (s.tp * s.pp);
  Evaluation best;
  bool have = false;
  for (int stage = 0; stage < s.pp; ++stage) {
    Evaluation ev = evaluate_stage(r, s, dp, stage);
    if (!have || ev.gpu.total > best.gpu.total || (ev.gpu.total == best.gpu.total && ev.cpu.total > best.cpu.total)) {
      best = std::move(ev);
      have = true;
    }
  }
  return best;
}

bool fits(const Evaluation& ev) { return ev.gpu.fits() && ev.cpu.fits() && ev.nvme.fits(); }

// The largest power-of-two micro-batch that fits, 0 when even 1 does not.
int64_t max_micro_batch(const Resolved& r, TrainingSetup s, int64_t limit) {
  if (!r.shape) return fits(evaluate(r, s)) ? s.micro_batch : 0;  // no activations: the micro-batch changes nothing
  int64_t best = 0;
  for (int64_t mb = 1; mb <= limit; mb *= 2) {
    s.micro_batch = mb;
    if (!fits(evaluate(r, s))) break;
    best = mb;
  }
  return best;
}

std::vector<std::pair<std::string, std::string>> offload_choices(int stage) {
  if (stage == 0) return {{"none", "none"}};
  if (stage < 3) return {{"none", "none"}, {"cpu", "none"}};
  return {{"none", "none"}, {"cpu", "none"}, {"cpu", "cpu"}, {"nvme", "none"}, {"nvme", "cpu"}, {"nvme", "nvme"}};
}

OptionRow row_of(const Evaluation& ev, const TrainingSetup& s) {
  OptionRow row;
  row.zero_stage = s.zero_stage;
  row.offload_optimizer = s.offload_optimizer;
  row.offload_param = s.offload_param;
  row.activation_checkpointing = s.activation_checkpointing;
  row.micro_batch = s.micro_batch;
  row.per_gpu = ev.gpu.total;
  row.per_node_cpu = ev.cpu.total;
  row.per_node_nvme = ev.nvme.total;
  row.per_gpu_model_states = ev.gpu.model_states;
  row.per_gpu_activations = ev.gpu.activations;
  row.fits = fits(ev);
  row.validated = ev.validated;
  return row;
}

Resolved resolve_model(const EstimateInputs& in) {
  Resolved r;
  const MoeConfig* moe = in.setup.moe ? &*in.setup.moe : nullptr;
  const ModelSpec& m = in.model;
  r.name = m.name;
  r.shape = m.shape;
  if (r.shape) {  // the setup's attention decides what the shape stores (TrainingSetup::attention)
    r.shape->flash_attention = in.setup.flash_attention.value_or(in.setup.attention == "sdpa");
    r.shape->validate();
  }
  if (!m.tensors.empty()) {
    r.tensors = m.tensors;
    r.explicit_tensors = true;
    r.params = param_count(r.tensors);
    r.largest = m.largest_layer_params > 0 ? m.largest_layer_params : largest_module_params(r.tensors);
  } else if (m.params > 0) {
    r.params = m.params;  // a bare count wins over the shape's (the shape then only sizes activations)
    r.largest = m.largest_layer_params;
    if (r.shape && r.largest == 0) r.largest = largest_module_params(transformer_tensors(*r.shape, moe));
  } else if (r.shape) {
    r.tensors = transformer_tensors(*r.shape, moe);
    r.params = param_count(r.tensors);
    r.largest = m.largest_layer_params > 0 ? m.largest_layer_params : largest_module_params(r.tensors);
  } else {
    throw std::invalid_argument(
        "no model: give a parameter count (--params), a transformer shape (--layers, --hidden, --heads, --vocab, "
        "--seq-len) or a preset (--preset)");
  }
  if (r.params <= 0) throw std::invalid_argument("the model has no parameters");
  r.hw = in.hardware;
  if (r.hw.device != "gpu" && r.hw.device != "cpu")
    throw std::invalid_argument("device must be \"gpu\" or \"cpu\", not \"" + r.hw.device + "\"");
  if (r.hw.gpus_per_node < 1 || r.hw.nodes < 1) throw std::invalid_argument("gpus_per_node and nodes must be >= 1");
  r.world = r.hw.gpus_per_node * r.hw.nodes;
  r.al = in.allowance;
  const bool gpu = r.hw.device == "gpu";
  if (r.al.device_overhead < 0) r.al.device_overhead = gpu ? kGiB : 0;
  if (r.al.host_overhead < 0) r.al.host_overhead = gpu ? kGiB : kGiB / 2;
  if (r.al.fragmentation < 0) throw std::invalid_argument("fragmentation must be >= 0");
  // The cost model's rates (docs/estimator.md). gpu: an A100-80GB-class node — 150 TFLOP/s
  // achieved in bf16/fp16 (about half of the 312 peak), 15 in fp32 (PyTorch's default fp32 matmul,
  // no TF32; peak 19.5), NVLink collectives at 200 GB/s bus bandwidth, 25 GB/s per GPU between
  // nodes (200 Gb/s InfiniBand), PCIe 4.0 x16 at 20 GB/s, 100 GB/s of host memory bandwidth per
  // node, one NVMe drive at 6 GB/s. cpu: a CPU rank at 0.1 TFLOP/s, Gloo at 1 GB/s (the loopback
  // figure of docs/benchmarks.md), "transfers" within host memory.
  Hardware& h = r.hw;
  const bool fp32 = in.setup.precision == "fp32";
  auto rate = [](double& v, double fallback) {
    if (v < 0) v = fallback;
    if (!(v > 0)) throw std::invalid_argument("cost-model rates must be > 0");
  };
  rate(h.gpu_tflops, gpu ? (fp32 ? 15 : 150) : 0.1);
  rate(h.intra_node_gbps, gpu ? 200 : 1);
  rate(h.inter_node_gbps, gpu ? 25 : 1);
  rate(h.host_memory_gbps, gpu ? 100 : 10);
  rate(h.pcie_gbps, gpu ? 20 : h.host_memory_gbps);
  rate(h.nvme_gbps, 6);
  return r;
}

}  // namespace


// ---- public ------------------------------------------------------------------------------------

EstimateResult estimate(const EstimateInputs& in) {
  const Resolved r = resolve_model(in);
  check_setup(in.setup, r.world);
  EstimateResult out;
  out.model_name = r.name.empty() ? (r.shape ? "custom transformer" : "custom model") : r.name;
  out.params = r.params;
  out.largest_layer_params = r.largest;
  out.world = r.world;
  out.setup = in.setup;
  if (in.setup.flash_attention) out.setup.attention = *in.setup.flash_attention ? "sdpa" : "eager";
  out.dp = r.world / (in.setup.tp * in.setup.pp * in.setup.cp);  // the batch's data-parallel size (ZeRO: dp x cp)
  out.hardware = r.hw;
  out.allowance = r.al;
  out.has_shape = r.shape.has_value();
  out.shape = r.shape;

  Evaluation ev = evaluate(r, in.setup);
  out.per_gpu = ev.gpu;
  out.per_node_cpu = ev.cpu;
  out.per_node_nvme = ev.nvme;
  out.activations = ev.act;
  out.params_per_gpu = ev.params_per_gpu;
  out.validated = ev.validated;
  out.fits = fits(ev);
  const std::string where = r.hw.device == "gpu" ? "per GPU" : "per rank";
  auto shortfall = [&](const std::string& what, const Placement& p) {
    if (!p.fits())
      out.shortfalls.push_back(what + ": " + format_gib(p.total) + " needed, " + format_gib(p.capacity) +
                               " available: " + format_gib(p.total - p.capacity) + " short");
  };
  shortfall("per GPU", ev.gpu);
  shortfall("per node CPU", ev.cpu);
  shortfall("per node NVMe", ev.nvme);

  // Notes: what is assumed, what is a design estimate.
  auto& notes = out.notes;
  const auto& s = in.setup;
  if (out.validated)
    notes.push_back("model states and buckets follow tessera's engine (zero/zero_optimizer.cpp), checked against "
                    "its measured memory by tests/engine/estimator/test_estimator.cpp");
  else {
    std::vector<std::string> missing;
    if (s.offload_optimizer != "none" || s.offload_param != "none") missing.push_back("offload");
    if (s.tp > 1) missing.push_back("tensor parallelism");
    if (s.pp > 1) missing.push_back("pipeline parallelism");
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i)
      list += (i == 0 ? "" : i + 1 == missing.size() ? " and " : ", ") + missing[i];
    notes.push_back("design estimate, not yet validated against the engine: " + list +
                    (missing.size() > 1 ? " are" : " is") +
                    " not implemented in the engine yet; the figures follow the DeepSpeed-like design in docs/estimator.md");
  }
  if (!r.shape)
    notes.push_back("no transformer shape: activations are not included (give --preset or --layers/--hidden/--heads/"
                    "--vocab/--seq-len)");
  else
    notes.push_back("activations are analytic (Korthikanti et al. 2022; " +
                    std::string(r.shape->flash_attention
                                    ? "attention sdpa: PyTorch's scaled_dot_product_attention keeps no s x s scores "
                                      "(--attention eager: written-out attention)"
                                    : "attention eager: s x s scores, softmax and dropout masks stored per head") +
                    "), not measured; they assume the model stores what a standard transformer layer stores");
  const MoeConfig* moe = s.moe ? &*s.moe : nullptr;
  if (moe)
    notes.push_back("MoE: " + std::to_string(moe->num_experts) + " experts in every " + std::to_string(moe->every) +
                    "th block, " + std::to_string(moe->num_experts / moe->ep_size) + " on each rank (ep " +
                    std::to_string(moe->ep_size) + "), their optimizer state over the dp/ep ranks holding the same "
                    "experts; activations " + (moe->drop_tokens ? "at the capacity" : "at the dropless worst case: "
                    "every choice of the ep group's ranks routed to this rank's experts (balanced routing needs 1/ep of it)"));
  if (r.shape && in.model.tensors.empty() && in.model.params > 0 &&
      in.model.params != param_count(transformer_tensors(*r.shape, moe)))
    notes.push_back("the parameter count given (" + count_str(in.model.params) + ") differs from the shape's (" +
                    count_str(param_count(transformer_tensors(*r.shape, moe))) +
                    "): model states use the count, activations the shape");
  if (s.tp > 1)
    notes.push_back("tensor parallelism: linear weights and the vocab-parallel embedding/head split by tp; norms and "
                    "row-parallel biases replicated" + std::string(r.tensors.empty() ? " (bare count: Ψ/(tp·pp))" : ""));
  if (s.pp > 1)
    notes.push_back("pipeline: layers split evenly (first stages take the remainder); embedding on the first stage, "
                    "final norm and head on the last (a tied head keeps a copy there); figures are the busiest stage's (" +
                    std::to_string(out.activations.stage) + "), 1F1B keeps min(pp - stage, micro-batches) in flight");
  if (s.pp > 1 && s.zero_stage > 1) notes.push_back("DeepSpeed's pipeline engine allows ZeRO stages 0 and 1 only");
  if (s.zero_stage == 3 && r.largest == 0)
    notes.push_back("largest layer unknown (--largest-layer-params): ZeRO-3's gathered parameters count the prefetch bucket only");
  if (r.hw.device == "gpu" && r.hw.cpu_memory == 0) notes.push_back("CPU memory per node not given: not checked");
  if ((s.offload_optimizer == "nvme" || s.offload_param == "nvme") && r.hw.nvme_capacity == 0)
    notes.push_back("no NVMe capacity given (--nvme): NVMe offload cannot fit");
  if (r.hw.device == "cpu") notes.push_back("CPU device: ranks are processes on the node; their buffers are counted in the node's CPU memory");

  if (!in.search) return out;
  // The table: every stage × offload choice at the given micro-batch and checkpointing.
  // The options: every stage × offload × checkpointing choice that fits at some micro-batch, at
  // its largest one (the cost per sample only falls as the micro-batch grows), cheapest first.
  auto candidate = [&](TrainingSetup t, int stage, const std::string& opt, const std::string& param) {
    t.zero_stage = stage;
    t.offload_optimizer = opt;
    t.offload_param = param;
    OptionRow row = row_of(evaluate(r, t), t);
    row.max_micro_batch = max_micro_batch(r, t, in.max_micro_batch);
    if (row.max_micro_batch > 0) t.micro_batch = row.max_micro_batch;
    row.cost = option_cost(r.hw, r.shape, r.world, t, out.params_per_gpu);  // tp and pp, hence the parameters per GPU, are fixed
    if (row.micro_batch == t.micro_batch) return std::make_pair(row, row);
    return std::make_pair(row, row_of(evaluate(r, t), t));
  };
  // Checkpointing: none and full; selective (the attention core) only where it saves something,
  // eager attention's s² terms; and always the one set up. Without a shape there are no activations.
  std::vector<std::string> modes = {s.activation_checkpointing};
  if (r.shape) {
    modes.clear();
    for (const char* m : {"none", "selective", "full"})
      if (m == s.activation_checkpointing || std::string(m) != "selective" || !r.shape->flash_attention)
        modes.push_back(m);
  }
  bool fits_without_checkpointing = false;
  for (const auto& mode : modes) {
    TrainingSetup base = s;
    if (mode != s.activation_checkpointing) {
      base.activation_checkpointing = mode;
      if (mode == "full") base.checkpoint_interval = 1;
    }
    for (int stage = 0; stage <= 3; ++stage)
      for (const auto& [opt, param] : offload_choices(stage)) {
        auto [row, at_max] = candidate(base, stage, opt, param);
        if (mode == s.activation_checkpointing) out.table.push_back(row);
        if (row.max_micro_batch == 0) continue;
        at_max.max_micro_batch = row.max_micro_batch;
        at_max.cost = row.cost;
        out.options.push_back(at_max);
        fits_without_checkpointing |= mode == "none";
      }
  }
  auto checkpointing_level = [](const std::string& m) { return m == "none" ? 0 : m == "selective" ? 1 : 2; };
  auto nanoseconds = [](const OptionRow& o) { return std::llround(o.cost.total() * 1e9); };  // equal costs tie
  std::stable_sort(out.options.begin(), out.options.end(), [&](const OptionRow& a, const OptionRow& b) {
    const int64_t ca = nanoseconds(a), cb = nanoseconds(b);
    if (ca != cb) return ca < cb;
    if (a.max_micro_batch != b.max_micro_batch) return a.max_micro_batch > b.max_micro_batch;
    if (a.zero_stage != b.zero_stage) return a.zero_stage < b.zero_stage;
    const int la = offload_level(a.offload_optimizer, a.offload_param), lb = offload_level(b.offload_optimizer, b.offload_param);
    if (la != lb) return la < lb;
    return checkpointing_level(a.activation_checkpointing) < checkpointing_level(b.activation_checkpointing);
  });
  if (out.options.empty())
    out.options_note = r.shape ? "nothing fits, even with full activation checkpointing" : "nothing fits";
  else if (r.shape && !fits_without_checkpointing)
    out.options_note = "nothing fits without activation checkpointing";
  return out;
}

}  // namespace tessera
