// The memory estimator (engine/estimator.h). docs/estimator.md states every formula used here.
#include "engine/estimator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/config_io.h"
#include "zero/flat_layout.h"

namespace tessera {

using nlohmann::json;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
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

int compute_bytes(const TrainingSetup& s) { return s.precision == "fp32" ? 4 : 2; }
bool mixed_precision(const TrainingSetup& s) { return s.precision != "fp32"; }

// Optimizer state bytes per parameter (fp32): Adam/AdamW/LAMB keep m and v; SGD keeps a momentum
// buffer only with momentum. OneBitAdam: m and v (its error-feedback buffers are not counted).
int state_bytes_per_param(const TrainingSetup& s) {
  if (s.optimizer == "SGD") return s.momentum > 0 ? 4 : 0;
  return 8;
}
std::string state_name(const TrainingSetup& s) {
  if (s.optimizer == "SGD") return s.momentum > 0 ? "SGD momentum" : "SGD (no state)";
  if (s.optimizer == "Lamb") return "LAMB m, v";
  return s.optimizer + " m, v";
}

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

// The parameters one rank of pipeline stage `stage` (tensor-parallel rank 0) holds.
struct StageModel {
  std::vector<ParamTensor> tensors;  // tensor-parallel split applied, registration order
  int64_t params = 0;
  int64_t largest = 0;               // largest module, split
  int64_t layers = 0;
  bool first = true, last = true;
};

std::pair<int64_t, int64_t> stage_layers(int64_t layers, int pp, int stage) {  // first layer, count
  const int64_t base = layers / pp, extra = layers % pp;
  const int64_t count = base + (stage < extra ? 1 : 0);
  const int64_t first = stage * base + std::min<int64_t>(stage, extra);
  return {first, count};
}

StageModel stage_model(const Resolved& r, const TrainingSetup& s, int stage) {
  StageModel m;
  m.first = stage == 0;
  m.last = stage == s.pp - 1;
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

// Parameter groups: the engine keeps one flat layout per group.
std::vector<std::vector<int64_t>> group_numels(const StageModel& m, const TrainingSetup& s) {
  std::map<int, std::vector<int64_t>> groups;
  for (const auto& t : m.tensors) groups[s.param_groups == 1 ? 0 : t.group].push_back(t.numel);
  std::vector<std::vector<int64_t>> out;
  for (auto& [g, numels] : groups)
    if (!numels.empty()) out.push_back(std::move(numels));
  return out;
}

// ---- model states --------------------------------------------------------------------------

// Per rank, in bytes, by where they live.
struct States {
  // device
  int64_t params = 0, master = 0, grads = 0, optim = 0, gathered = 0, buckets = 0, construction = 0;
  std::string params_detail, master_detail, grads_detail, optim_detail, gathered_detail, buckets_detail;
  // host (per rank)
  int64_t h_params = 0, h_master = 0, h_grads = 0, h_optim = 0, h_pinned = 0, h_construction = 0;
  std::string h_pinned_detail;
  // NVMe (per rank)
  int64_t n_params = 0, n_master = 0, n_grads = 0, n_optim = 0;
};

std::string part(int n) { return n == 1 ? "whole" : "1/" + std::to_string(n); }

States model_states(const StageModel& m, const TrainingSetup& s, int dp) {
  States st;
  const int c = compute_bytes(s), k = state_bytes_per_param(s);
  const bool mixed = mixed_precision(s);
  const bool off_opt = s.offload_optimizer != "none", off_param = s.offload_param != "none";
  const auto groups = group_numels(m, s);
  const int staging_buffers = std::max<int>(static_cast<int>(groups.size()), s.param_groups);
  const std::string dtype = s.precision;

  if (s.zero_stage <= 2) {
    // Exactly the engine's buffers (zero/zero_optimizer.cpp), one flat layout per group.
    const int partitions = s.zero_stage == 0 ? 1 : dp;
    int64_t total = 0, shard = 0, largest_bucket = 0, max_shard = 0;
    // Construction (ZeroOptimizer's constructor, group by group): the model's own fp32 tensors
    // not yet re-pointed, this group's compute buffer and master shard (copied straight from the
    // model's tensors), and the earlier groups' compute buffers and master shards.
    int64_t remaining_model = 4 * m.params, built = 0;
    for (const auto& numels : groups) {
      FlatLayout L = FlatLayout::build(numels, partitions, s.reduce_bucket_size);
      total += L.total;
      shard += L.shard_numel;
      for (const auto& b : L.buckets) {
        largest_bucket = std::max(largest_bucket, b.numel);
        max_shard = std::max(max_shard, b.shard);
      }
      int64_t group_params = 0;
      for (auto n : numels) group_params += n;
      const int64_t compute = c * L.total;
      const int64_t master = (mixed && !off_opt) ? 4 * L.shard_numel : 0;
      st.construction = std::max(st.construction, remaining_model + built + compute + master);
      remaining_model -= 4 * group_params;
      built += c * L.total + master;
    }
    st.params = c * total;
    st.params_detail = dtype + ", whole";
    if (s.tp * s.pp > 1) st.params_detail += " (this rank's tp/pp share: " + count_str(m.params) + ")";
    if (!off_opt) {
      if (mixed) st.master = 4 * shard, st.master_detail = part(partitions);
      st.grads = 4 * (s.zero_stage == 2 ? shard : total);
      st.grads_detail = "fp32, " + part(s.zero_stage == 2 ? dp : 1);
      st.optim = int64_t(k) * shard;
      st.optim_detail = state_name(s) + ", " + part(partitions);
    } else {
      // Design (not in the engine yet): the optimizer runs on the host over this rank's shard;
      // stage 1 still accumulates the full fp32 gradient on the device until the boundary.
      if (s.zero_stage == 1) st.grads = 4 * total, st.grads_detail = "fp32 accumulation, whole";
      int64_t* master = s.offload_optimizer == "cpu" ? &st.h_master : &st.n_master;
      int64_t* grads = s.offload_optimizer == "cpu" ? &st.h_grads : &st.n_grads;
      int64_t* optim = s.offload_optimizer == "cpu" ? &st.h_optim : &st.n_optim;
      *master = 4 * shard, *grads = 4 * shard, *optim = int64_t(k) * shard;
      if (s.offload_optimizer == "nvme") {
        st.h_pinned = int64_t(s.optimizer_buffer_count) * std::min(s.sub_group_size, shard) * 4;
        st.h_pinned_detail = std::to_string(s.optimizer_buffer_count) + " optimizer swap buffers";
      }
    }
    // Communication buffers (zero/zero_optimizer.cpp: launch_bucket, acquire_staging).
    if (s.zero_stage == 1 && dp > 1) {
      st.buckets = 4 * shard;  // a receive chunk per bucket, all alive until the end of backward
      st.buckets_detail = "fp32 receive chunk of every bucket, alive until backward ends";
    } else if (s.zero_stage == 2) {
      st.buckets = int64_t(staging_buffers) * 4 * largest_bucket + (dp > 1 ? int64_t(staging_buffers) * 4 * max_shard : 0);
      st.buckets_detail = std::to_string(staging_buffers) + " fp32 staging buffer" + (staging_buffers > 1 ? "s" : "") +
                          " of " + count_str(largest_bucket) + " elements" + (dp > 1 ? " + receive chunks" : "");
    }
    return st;
  }

  // ZeRO-3 (design estimate): each tensor partitioned over dp (padded per tensor, as DeepSpeed),
  // tensors of at most stage3_param_persistence_threshold elements kept whole.
  int64_t shard = 0, persistent = 0, sharded_total = 0;
  for (const auto& numels : groups)
    for (auto n : numels) {
      shard += ceil_div(n, dp);
      if (n <= s.stage3_param_persistence_threshold) persistent += n;
      else sharded_total += ceil_div(n, dp);
    }
  if (!off_param) {
    st.params = int64_t(c) * (sharded_total + persistent);
    st.params_detail = dtype + ", " + part(dp) + (persistent ? " + small persistent tensors whole" : "");
  } else {
    st.params = int64_t(c) * persistent;
    st.params_detail = dtype + ", persistent small tensors only";
    if (s.offload_param == "cpu") st.h_params = int64_t(c) * sharded_total;
    else {
      st.n_params = int64_t(c) * sharded_total;
      st.h_pinned += int64_t(s.param_buffer_count) * s.param_buffer_size * c;
      st.h_pinned_detail = std::to_string(s.param_buffer_count) + " parameter swap buffers";
    }
  }
  // Gathered for compute: the current module plus prefetched ones (bounded by max_live), and the
  // module's gradient in the compute dtype before it is folded into the fp32 buckets.
  const int64_t live = std::min({s.stage3_max_live_parameters, m.largest + s.stage3_prefetch_bucket_size, m.params});
  st.gathered = int64_t(c) * (live + m.largest);
  st.gathered_detail = "largest module " + count_str(m.largest) + " + prefetch, and its gradient";
  const double ratio = off_opt ? s.offload_optimizer_ratio : 0.0;
  const int64_t master = mixed || off_opt ? 4 * shard : 0, grads = 4 * shard, optim = int64_t(k) * shard;
  auto split = [&](int64_t bytes, int64_t& device, int64_t& host, int64_t& nvme) {
    const int64_t away = round_bytes(bytes * ratio);
    device = bytes - away;
    (s.offload_optimizer == "nvme" ? nvme : host) += away;
  };
  split(master, st.master, st.h_master, st.n_master);
  split(grads, st.grads, st.h_grads, st.n_grads);
  split(optim, st.optim, st.h_optim, st.n_optim);
  st.master_detail = part(dp);
  st.grads_detail = "fp32, " + part(dp);
  st.optim_detail = state_name(s) + ", " + part(dp);
  if (s.offload_optimizer == "nvme") {
    st.h_pinned += int64_t(s.optimizer_buffer_count) * std::min(s.sub_group_size, shard) * 4;
    st.h_pinned_detail += std::string(st.h_pinned_detail.empty() ? "" : ", ") +
                          std::to_string(s.optimizer_buffer_count) + " optimizer swap buffers";
  }
  // Gradient staging as at stage 2: reduce_bucket_size fp32 elements per concurrently filling bucket.
  const int64_t bucket = std::min(s.reduce_bucket_size, m.params);
  st.buckets = int64_t(staging_buffers) * 4 * bucket + (dp > 1 ? int64_t(staging_buffers) * 4 * ceil_div(bucket, dp) : 0);
  st.buckets_detail = std::to_string(staging_buffers) + " fp32 staging buffer" + (staging_buffers > 1 ? "s" : "") +
                      " of " + count_str(bucket) + " elements" + (dp > 1 ? " + receive chunks" : "");
  st.construction = 4 * m.largest;  // built partitioned, as DeepSpeed's zero.Init
  return st;
}

// ---- activations ---------------------------------------------------------------------------

struct Activations {
  int64_t layer_full = 0;    // one layer, no checkpointing
  int64_t layer_stored = 0;  // one layer as stored under the checkpointing mode (per micro-batch)
  int64_t checkpoint = 0;    // full checkpointing: one checkpointed input
  int64_t embedding = 0;     // per micro-batch on the first stage
  int64_t output = 0;        // the last stage: final norm, head input, fp32 logits and their gradient
  std::string formula;
};

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4,
// generalized to any ffn size, grouped-query attention, SwiGLU, no dropout and fused attention;
// for a GPT shape (ffn 4h, MHA, dropout, 16-bit) it is exactly sbh(34 + 5as/h) per layer, or
// sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, sbh(34/t + 5as/(ht)) with sequence parallelism.
Activations activation_terms(const TransformerShape& sh, const TrainingSetup& s, int64_t micro_batch) {
  Activations a;
  const double S = sh.seq_len, b = micro_batch, h = sh.hidden, heads = sh.heads, kv = sh.kv_dim(), f = sh.ffn_dim();
  const double t = s.tp, e = s.precision == "fp32" ? 4 : 2, sbh = S * b * h;
  const bool sp = s.sequence_parallel && s.tp > 1;
  const bool flash = s.flash_attention.value_or(sh.flash_attention);
  const double mask = sh.dropout ? 1 : 0;
  // Replicated across tensor-parallel ranks unless sequence parallelism splits them: the two
  // norms' inputs, the QKV and MLP inputs, and the two dropout masks after attention and MLP.
  const double replicated = (4 * e + 2 * mask) * sbh / (sp ? t : 1);
  // Split by t: Q, K, V, the attention output projection's input, the MLP's inner activations.
  const double mlp = (sh.mlp == "swiglu" ? 3 : 2) * e * S * b * f;
  const double split = (2 * e * sbh + 2 * e * S * b * kv + mlp) / t;
  // The attention core: softmax output (and with dropout its mask and output), a·s²·b each;
  // fused attention keeps only the fp32 log-sum-exp (4·a·s·b).
  const double core = flash ? 4 * heads * S * b / t : (e + mask * (1 + e)) * heads * S * S * b / t;
  a.layer_full = round_bytes(replicated + split + core);
  a.checkpoint = round_bytes(e * sbh / ((sp || s.partition_activations) ? t : 1));
  if (s.activation_checkpointing == "full") a.layer_stored = a.checkpoint;
  else if (s.activation_checkpointing == "selective") a.layer_stored = round_bytes(replicated + split);
  else a.layer_stored = a.layer_full;
  a.embedding = round_bytes(mask * sbh / (sp ? t : 1));
  a.output = round_bytes(2 * e * sbh / (sp ? t : 1) + 8.0 * S * b * sh.vocab / t);

  // The formula in words, in sbh units (Korthikanti's).
  const double rep_c = 4 * e + 2 * mask;
  const double split_c = 2 * e + 2 * e * kv / h + (sh.mlp == "swiglu" ? 3 : 2) * e * f / h;
  std::string terms;
  if (t > 1) terms = fmt("%.4g", rep_c) + (sp ? "/t" : "") + " + " + fmt("%.4g", split_c) + "/t";
  else terms = fmt("%.4g", rep_c + split_c);
  if (flash) terms += " + 4a/h" + (t > 1 ? std::string("t") : "") + " (fused attention: fp32 log-sum-exp)";
  else terms += " + " + fmt("%g", e + mask * (1 + e)) + (t > 1 ? "as/(ht)" : "as/h");
  a.formula = "sbh(" + terms + ")";
  if (s.activation_checkpointing == "selective" && !flash) a.formula += "; selective recomputation drops the s^2 term";
  if (sh.mlp == "gelu" && sh.ffn_dim() == 4 * sh.hidden && kv == h && sh.dropout && e == 2 && !flash)
    a.formula += " (Korthikanti et al.'s formula)";
  return a;
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
  const States st = model_states(m, s, dp);
  const bool cpu_device = r.hw.device == "cpu";
  const int ranks = r.hw.gpus_per_node;

  // Activations of this stage.
  ActivationDetail& ad = ev.act;
  ad.stage = stage;
  int64_t act_device = 0;
  if (r.shape) {
    const Activations a = activation_terms(*r.shape, s, s.micro_batch);
    const int64_t m_batches = s.pipeline_micro_batches > 0 ? s.pipeline_micro_batches : s.gradient_accumulation;
    ad.in_flight = s.pp > 1 ? std::max<int64_t>(1, std::min<int64_t>(s.pp - stage, m_batches)) : 1;
    ad.layers_held = m.layers;
    ad.per_layer_full = a.layer_full;
    ad.formula = a.formula;
    int64_t stored;
    if (s.activation_checkpointing == "full") {
      const int64_t interval = std::max(1, s.checkpoint_interval);
      const int64_t checkpoints = ceil_div(m.layers, interval);
      ad.per_layer = a.checkpoint;
      stored = ad.in_flight * checkpoints * a.checkpoint;
      ad.recompute = std::min<int64_t>(interval, m.layers) * a.layer_full;
    } else {
      ad.per_layer = a.layer_stored;
      stored = ad.in_flight * m.layers * a.layer_stored;
    }
    if (s.cpu_checkpointing && s.activation_checkpointing == "full") {
      ad.on_cpu = stored;
      stored = 0;
    }
    ad.embedding = m.first ? ad.in_flight * a.embedding : 0;
    ad.logits = m.last ? a.output : 0;
    // The output layer's backward (logits and their gradient) runs before any layer is
    // recomputed, and its buffers are freed by then: the two peaks do not add.
    act_device = stored + ad.embedding + std::max(ad.logits, ad.recompute);
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
    add_line(g, "activations", act_device, detail);
  }
  g.activations = act_device;
  const int64_t device_overhead = cpu_device ? 0 : r.al.device_overhead;
  finish(g, st.construction,
         s.zero_stage == 3 ? "modules built partitioned (zero.Init-like)"
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
  c.model_states += ranks * (st.h_params + st.h_master + st.h_grads + st.h_optim);
  c.buffers += ranks * st.h_pinned;
  c.activations += ranks * ad.on_cpu;
  // Construction on the host: each rank builds its model in fp32 before moving it to the GPU
  // (DeepSpeed's 4·P·gpus_per_node term); ZeRO-3 builds it partitioned (zero.Init).
  int64_t host_construction = 0;
  if (cpu_device) host_construction = ranks * st.construction;
  else host_construction = ranks * (s.zero_stage == 3 ? 4 * m.largest : 4 * m.params);
  const int64_t host_overhead = int64_t(ranks) * r.al.host_overhead;
  finish(c, host_construction,
         cpu_device ? "the engine's construction on every rank"
                    : (s.zero_stage == 3 ? "each rank builds its largest module in fp32 on the host"
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

  ev.validated = s.zero_stage <= 2 && s.offload_optimizer == "none" && s.offload_param == "none" && s.tp == 1 &&
                 s.pp == 1;
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
  const ModelSpec& m = in.model;
  r.name = m.name;
  r.shape = m.shape;
  if (r.shape) {
    if (in.setup.flash_attention) r.shape->flash_attention = *in.setup.flash_attention;
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
    if (r.shape && r.largest == 0) r.largest = largest_module_params(transformer_tensors(*r.shape));
  } else if (r.shape) {
    r.tensors = transformer_tensors(*r.shape);
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
  return r;
}

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
  if (s.tp < 1 || s.pp < 1) bad("tensor and pipeline degrees must be >= 1");
  if (world % (int64_t(s.tp) * s.pp) != 0)
    bad("tp x pp = " + std::to_string(s.tp * s.pp) + " does not divide the " + std::to_string(world) + " GPUs");
  if (s.activation_checkpointing != "none" && s.activation_checkpointing != "selective" &&
      s.activation_checkpointing != "full")
    bad("activation checkpointing must be none, selective or full, not \"" + s.activation_checkpointing + "\"");
  if (s.param_groups < 0) bad("param_groups must be >= 0");
  if (s.reduce_bucket_size < 1) bad("reduce_bucket_size must be >= 1");
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------

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
  s.precision = c.bf16.enabled ? "bf16" : c.fp16.enabled ? "fp16" : "fp32";
  if (c.optimizer) {
    s.optimizer = c.optimizer->type;
    s.momentum = c.optimizer->params.momentum;
  }
  s.micro_batch = c.train_micro_batch_size_per_gpu.value_or(1);
  s.gradient_accumulation = c.gradient_accumulation_steps.value_or(1);
  s.pipeline_micro_batches = c.pipeline.micro_batches.value_or(0);
  s.tp = c.tensor_parallel.tp_size;
  s.pp = c.pipeline.stages;
  const auto& ac = c.activation_checkpointing;
  if (c.pipeline.activation_checkpoint_interval > 0) {
    s.activation_checkpointing = "full";
    s.checkpoint_interval = c.pipeline.activation_checkpoint_interval;
  } else if (ac.partition_activations || ac.cpu_checkpointing || ac.number_checkpoints) {
    s.activation_checkpointing = "full";  // the section only matters to a model that checkpoints
  }
  s.partition_activations = ac.partition_activations;
  s.cpu_checkpointing = ac.cpu_checkpointing;
  s.reduce_bucket_size = z.reduce_bucket_size;
  s.allgather_bucket_size = z.allgather_bucket_size;
  s.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  s.stage3_max_live_parameters = z.stage3_max_live_parameters;
  s.stage3_param_persistence_threshold = z.stage3_param_persistence_threshold;
  s.sub_group_size = z.sub_group_size;
  s.optimizer_buffer_count = z.offload_optimizer.buffer_count;
  s.offload_optimizer_ratio = z.offload_optimizer.ratio;
  s.param_buffer_count = z.offload_param.buffer_count;
  s.param_buffer_size = z.offload_param.buffer_size;
  return s;
}

EstimateResult estimate(const EstimateInputs& in) {
  const Resolved r = resolve_model(in);
  check_setup(in.setup, r.world);
  EstimateResult out;
  out.model_name = r.name.empty() ? (r.shape ? "custom transformer" : "custom model") : r.name;
  out.params = r.params;
  out.largest_layer_params = r.largest;
  out.world = r.world;
  out.setup = in.setup;
  out.dp = r.world / (in.setup.tp * in.setup.pp);
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
                    "its measured memory by tests/test_estimator.cpp");
  else {
    std::vector<std::string> missing;
    if (s.zero_stage == 3) missing.push_back("ZeRO-3");
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
    notes.push_back("activations are analytic (Korthikanti et al. 2022, " +
                    std::string(r.shape->flash_attention ? "fused attention" : "attention scores materialized") +
                    "), not measured; they assume the model stores what a standard transformer layer stores");
  if (r.shape && in.model.tensors.empty() && in.model.params > 0 &&
      in.model.params != param_count(transformer_tensors(*r.shape)))
    notes.push_back("the parameter count given (" + count_str(in.model.params) + ") differs from the shape's (" +
                    count_str(param_count(transformer_tensors(*r.shape))) +
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
  // The table over stage × offload at the given micro-batch, and the cheapest options that fit.
  auto run_search = [&](TrainingSetup base) {
    std::vector<OptionRow> rows;
    for (int stage = 0; stage <= 3; ++stage)
      for (const auto& [opt, param] : offload_choices(stage)) {
        TrainingSetup t = base;
        t.zero_stage = stage;
        t.offload_optimizer = opt;
        t.offload_param = param;
        OptionRow row = row_of(evaluate(r, t), t);
        row.max_micro_batch = max_micro_batch(r, t, in.max_micro_batch);
        rows.push_back(row);
      }
    return rows;
  };
  out.table = run_search(s);
  auto pick = [](std::vector<OptionRow> rows) {
    std::vector<OptionRow> ok;
    for (auto& row : rows)
      if (row.max_micro_batch > 0) ok.push_back(row);
    std::stable_sort(ok.begin(), ok.end(), [](const OptionRow& a, const OptionRow& b) {
      const int la = offload_level(a.offload_optimizer, a.offload_param), lb = offload_level(b.offload_optimizer, b.offload_param);
      if (la != lb) return la < lb;
      if (a.max_micro_batch != b.max_micro_batch) return a.max_micro_batch > b.max_micro_batch;
      return a.zero_stage < b.zero_stage;
    });
    return ok;
  };
  out.options = pick(out.table);
  if (out.options.empty() && r.shape && s.activation_checkpointing != "full") {
    TrainingSetup t = s;
    t.activation_checkpointing = "full";
    t.checkpoint_interval = 1;
    out.options = pick(run_search(t));
    out.options_note = out.options.empty() ? "nothing fits, even with full activation checkpointing"
                                           : "nothing fits as set up; these fit with full activation checkpointing";
  } else if (out.options.empty()) {
    out.options_note = "nothing fits";
  }
  return out;
}

// ---- JSON -------------------------------------------------------------------------------------

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

json row_json(const OptionRow& r) {
  return {{"zero_stage", r.zero_stage},
          {"offload_optimizer", r.offload_optimizer},
          {"offload_param", r.offload_param},
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
                {"tp", s.tp}, {"pp", s.pp}, {"dp", r.dp}, {"sequence_parallel", s.sequence_parallel},
                {"activation_checkpointing", s.activation_checkpointing}, {"reduce_bucket_size", s.reduce_bucket_size}};
  j["hardware"] = {{"device", r.hardware.device}, {"gpus_per_node", r.hardware.gpus_per_node},
                   {"nodes", r.hardware.nodes}, {"world_size", r.world}, {"gpu_memory_bytes", r.hardware.gpu_memory},
                   {"cpu_memory_bytes", r.hardware.cpu_memory}, {"nvme_bytes", r.hardware.nvme_capacity}};
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
                      {"formula", a.formula}};
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
    << ", pp " << s.pp << ", dp " << r.dp << ", activation checkpointing " << s.activation_checkpointing;
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
      << r.setup.micro_batch << ":\n";
    o << "   per CPU |    per GPU |  per NVMe | states/GPU | activ/GPU | fits | max mb | options\n";
    for (const auto& row : r.table) {
      o << gib_col(row.per_node_cpu, 10) << " |" << gib_col(row.per_gpu, 11) << " |" << gib_col(row.per_node_nvme, 10)
        << " |" << gib_col(row.per_gpu_model_states, 11) << " |" << gib_col(row.per_gpu_activations, 10) << " | "
        << (row.fits ? " yes" : "  no") << " | " << fmt("%6.0f", static_cast<double>(row.max_micro_batch)) << " | "
        << row.label() << (row.validated ? "" : " (design)") << "\n";
    }
    o << "  (design): ZeRO-3, offload, tensor/pipeline parallelism are design estimates, not yet validated against the engine\n";
    if (hw.nvme_capacity == 0) o << "  no NVMe capacity given (--nvme): NVMe offload rows cannot fit\n";
    o << "\nCheapest options that fit (least offload, then the largest micro-batch):\n";
    if (!r.options_note.empty()) o << "  " << r.options_note << "\n";
    int shown = 0;
    for (const auto& row : r.options) {
      if (++shown > 5) break;
      o << "  " << shown << ". zero_stage=" << row.zero_stage << ", offload_optimizer=" << row.offload_optimizer
        << ", offload_param=" << row.offload_param
        << (r.has_shape ? ": micro-batch up to " + std::to_string(row.max_micro_batch) : ": fits (no activations modelled)")
        << (row.validated ? "" : " (design estimate)") << "\n";
    }
  }
  return o.str();
}

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

EstimateInputs estimate_inputs_from_json(const json& req) {
  if (!req.is_object()) throw std::invalid_argument("the estimate request must be a JSON object");
  static const std::set<std::string> known = {
      "params", "largest_layer_params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len",
      "max_positions", "mlp", "norm", "biases", "tied_embeddings", "dropout", "flash_attention", "preset", "config",
      "zero", "offload_optimizer", "offload_param", "bf16", "fp16", "precision", "optimizer", "micro_batch", "gas",
      "tp", "pp", "pipeline_micro_batches", "sequence_parallel", "activation_checkpointing", "checkpoint_interval",
      "param_groups", "reduce_bucket_size", "gpus_per_node", "nodes", "gpu_mem", "cpu_mem", "nvme", "device",
      "fragmentation", "device_overhead", "host_overhead", "max_micro_batch", "search"};
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
  if (const json* c = get("config")) {
    if (c->is_object()) cfg = *c;
    else if (c->is_string()) {
      const std::string& text = c->get_ref<const std::string&>();
      const size_t first = text.find_first_not_of(" \t\r\n");
      const bool inline_json = first != std::string::npos && text[first] == '{';
      std::string source = inline_json ? "the config text" : "'" + text + "'";
      try {
        auto parsed = parse_json_text(inline_json ? text : read_text_file(text), source, report);
        if (!parsed) throw std::invalid_argument("invalid config " + source + ":\n" + report.errors());
        cfg = *parsed;
      } catch (const ConfigError& e) {
        throw std::invalid_argument(e.what());
      }
    } else {
      throw std::invalid_argument("config: a path, JSON text or an object");
    }
  }
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
  if (auto v = int_of("tp")) cfg["tensor_parallel"] = {{"tp_size", *v}};
  if (auto v = int_of("pp")) {
    if (!cfg.contains("pipeline") || !cfg["pipeline"].is_object()) cfg["pipeline"] = json::object();
    cfg["pipeline"]["stages"] = *v;
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
  if (auto v = bool_of("flash_attention")) s.flash_attention = *v;
  if (auto v = int_of("param_groups")) s.param_groups = static_cast<int>(*v);
  if (auto v = int_of("max_micro_batch")) in.max_micro_batch = *v;
  if (auto v = bool_of("search")) in.search = *v;
  check_setup(s, world);
  return in;
}

json estimate_json(const json& request) { return estimate_to_json(estimate(estimate_inputs_from_json(request))); }

}  // namespace tessera
