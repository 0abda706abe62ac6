#include "engine/planner/step_cost.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/planner/shared_cores.h"
#include "parallel/pipeline/schedule.h"

namespace tessera::planner {

using nlohmann::json;

std::string StepCost::bound() const {
  const std::pair<const char*, double> terms[] = {{"recompute", recompute}, {"tensor", tensor},   {"context", context},
                                                  {"experts", experts},     {"bubble", bubble},   {"p2p", p2p},
                                                  {"data", data},
                                                  {"accumulate", accumulate}, {"optimizer", optimizer}, {"offload", offload}};
  const char* name = "compute";
  double most = 0;
  for (const auto& [n, v] : terms)
    if (v > most) most = v, name = n;
  return name;
}

json StepCost::to_json() const {
  return {{"total", total()}, {"compute", compute}, {"recompute", recompute}, {"tensor", tensor},
          {"context", context}, {"experts", experts}, {"bubble", bubble}, {"p2p", p2p}, {"data", data},
          {"accumulate", accumulate}, {"optimizer", optimizer}, {"offload", offload}, {"bound", bound()}};
}

double one_f_one_b_bubble(int p, int m) { return double(p - 1) / double(m + p - 1); }

LayerShape layer_shape(const Layout& l, const TransformerShape& sh) {
  const int64_t h = sh.hidden, kv = sh.kv_dim(), f = sh.ffn_dim(), tp = l.tp;
  LayerShape shape;
  shape.micro = l.micro_batch;
  shape.tokens = sh.seq_len / l.cp;
  shape.seq_len = sh.seq_len;
  shape.hidden = h;
  shape.heads = sh.heads / (tp * l.cp);
  shape.linear_in = (h + 2 * kv) / tp;
  shape.linear_out = h / tp;
  // Key/value heads after Ulysses's all-to-all; too few to split (grouped-query attention with
  // fewer of them than tp · cp ranks): timed as full heads, a little more than the rank computes.
  const int64_t kv_heads = kv / (h / sh.heads);
  if (kv_heads % (tp * l.cp) == 0) {
    shape.kv_heads = kv_heads / (tp * l.cp);
  } else {
    shape.kv_heads = shape.heads;
    shape.linear_in = 3 * h / tp;
  }
  shape.ffn = f / tp;
  shape.swiglu = sh.mlp == "swiglu";
  shape.rmsnorm = sh.norm == "rmsnorm";
  return shape;
}

namespace {

// One micro-batch through one stage: forward and backward seconds, split into their terms.
struct StageTimes {
  double compute = 0, recompute = 0, tensor = 0, context = 0, experts = 0;  // forward + backward
  StageOpCost forward, backward;                               // what the pipeline runs: work at a core's speed, waits
};

// A linear MLP's forward + backward on `rows` rows at inner size `ffn` (SwiGLU: two products in).
double mlp_seconds(const Calibration& cal, const TransformerShape& sh, int64_t rows, int64_t ffn) {
  if (rows <= 0) return 0.0;
  return (sh.mlp == "swiglu" ? 2 : 1) * cal.linear_seconds(rows, sh.hidden, ffn) + cal.linear_seconds(rows, ffn, sh.hidden);
}

// What an MoE layer (docs/moe.md) costs one rank beyond the dense layer the probe timed: the
// router, and the experts in place of the MLP: whole on every tensor rank (replicated over tp),
// this rank's E/ep of them on the rows routed to them (k per token with balanced routing, at
// most the capacity when tokens drop: Fedus et al. 2021), less the dense MLP's tp share; and the
// four all-to-alls over the ep ranks (dispatch and combine, forward and backward), each sending
// (ep − 1)/ep of the routed rows, timed at the probed reduce-scatter's rate (the same bytes leave
// each rank).
struct MoeLayerTimes {
  double compute = 0, all_to_all = 0;
};

MoeLayerTimes moe_layer_times(const Layout& l, const TransformerShape& sh, const MoeConfig& moe, int64_t tokens,
                              const Calibration& cal, int compute_bytes, bool spans_nodes) {
  const int64_t f = sh.ffn_dim(), local = moe.num_experts / l.ep;
  const double share = moe.drop_tokens ? std::min(1.0, moe.capacity_factor) : 1.0;
  const double rows = double(tokens) * double(moe.k) * share;  // what this rank's E/ep experts process
  const int64_t per_expert = int64_t(std::ceil(rows / double(local)));
  MoeLayerTimes t;
  t.compute = cal.linear_seconds(tokens, sh.hidden, moe.num_experts) + double(local) * mlp_seconds(cal, sh, per_expert, f) -
              mlp_seconds(cal, sh, tokens, f / l.tp);
  if (l.ep > 1)
    t.all_to_all = 4 * cal.collective_seconds(Calibration::Collective::reduce_scatter,
                                              rows * double(sh.hidden) * compute_bytes, l.ep, spans_nodes,
                                              /*between_compute=*/true);
  return t;
}

StageTimes stage_times(const Layout& l, const TransformerShape& sh, int64_t layers, int64_t moe_layers, bool head,
                       const Calibration& cal, int compute_bytes, const std::string& context_method,
                       const MoeConfig* moe, bool experts_span_nodes) {
  const int64_t h = sh.hidden, kv = sh.kv_dim(), f = sh.ffn_dim(), tp = l.tp;
  const int64_t tokens = l.micro_batch * sh.seq_len / l.cp;  // rows of every matrix product on this rank
  // One layer's forward + backward: timed by the probe at this rank's shape, or its column-parallel
  // QKV and MLP-in, row-parallel output and MLP-out products and attention's core (4·s·h FLOPs
  // per token forward, 3x that with the backward) at the calibrated rates.
  const LayerShape shape = layer_shape(l, sh);
  double layer;  // forward + backward
  if (auto timed = cal.layer_seconds(shape)) {
    layer = *timed;
  } else {
    layer = cal.linear_seconds(tokens, h, (h + 2 * kv) / tp) + cal.linear_seconds(tokens, h / tp, h) +
            (sh.mlp == "swiglu" ? 2 : 1) * cal.linear_seconds(tokens, h, f / tp) + cal.linear_seconds(tokens, f / tp, h);
    const double attention = 4.0 * double(tokens) * double(sh.seq_len) * double(h) / double(tp);
    layer += 3 * cal.roofline_seconds(attention, 4.0 * double(tokens) * double(h) / tp * compute_bytes);
  }
  double work = double(layers) * layer;
  StageTimes t;
  if (moe && moe_layers > 0) {
    const MoeLayerTimes x = moe_layer_times(l, sh, *moe, tokens, cal, compute_bytes, experts_span_nodes);
    work += double(moe_layers) * x.compute;
    t.experts = double(moe_layers) * x.all_to_all;
  }
  if (l.activation_checkpointing == "full") t.recompute = work / 3;  // the layers' forward once more
  if (head) work += cal.linear_seconds(tokens, h, sh.vocab / tp);
  t.compute = work;  // the backward computes the gradients of inputs and weights: twice the forward
  // Tensor and context parallelism's collectives sit between compute segments of every rank.
  const double latency = cal.latency_seconds(l.cp, false, /*between_compute=*/true), bw = cal.intra_node_gbps.value * 1e9;
  const double activation = double(tokens) * double(h) * compute_bytes;
  if (l.tp > 1) {
    const double allreduce =
        cal.collective_seconds(Calibration::Collective::all_reduce, activation, int(tp), false, /*between_compute=*/true);
    t.tensor = 4.0 * double(layers) * allreduce;  // 2 forward, 2 backward per layer
  }
  if (l.cp > 1) {
    const double n = l.cp;
    if (context_method == "ring") {
      // cp − 1 passes of this rank's keys and values in the forward; keys, values and their
      // gradients in the backward.
      const double block = double(tokens) * double(2 * kv) / tp * compute_bytes;
      t.context = double(layers) * 3 * (n - 1) * (latency + block / bw);
    } else {
      // Ulysses: q, k, v to head-split and the output back (4 all-to-alls), again in the backward.
      const double qkv = double(tokens) * double(h + 2 * kv) / tp * compute_bytes, out = activation / tp;
      t.context = double(layers) * 2 * (4 * latency + (n - 1) / n * (qkv + out) / bw);
    }
  }
  const double comm = t.tensor + t.context + t.experts;
  t.forward = {work / 3, comm / 2};
  t.backward = {2 * work / 3 + t.recompute, comm / 2};
  return t;
}

// ZeRO's collectives for `params` parameters held alike by `ranks` ranks, each timed at its own
// probed rate: stage 0 allreduces the gradients; stages 1-2 reduce-scatter them (2: every
// micro-step) and all-gather the updated parameters; stage 3 also gathers them for every forward
// and backward. `backward`: one micro-batch's backward on the busiest stage (what stages 0-2's
// bucket reductions overlap); `busy`: the step's compute and in-layer communication (ZeRO-3's).
double zero_collectives(const Layout& l, double params, int ranks, bool spans, const EstimateResult& memory,
                        const Calibration& cal, const StageOpCost& backward, double busy, int64_t units) {
  if (ranks < 2 || params <= 0) return 0.0;
  using Collective = Calibration::Collective;
  const int c = memory.setup.precision == "fp32" ? 4 : 2;
  const int g = memory.setup.communication_dtype == "bf16" || memory.setup.communication_dtype == "fp16" ? 2 : 4;
  const double md = double(l.gradient_accumulation);
  // One collective a bucket: reduce_bucket_size elements (the whole model when it fits one); at
  // ZeRO-3 a unit's parameters (zero/flat_layout.h: its buckets never mix units), about a layer's,
  // except under a pipeline, where a stage has no units (engine/pipeline_engine.cpp). The size
  // picks the algorithm Gloo runs (Calibration::collective_seconds).
  const bool by_unit = l.zero_stage == 3 && l.pp == 1;
  const double bucket = std::max(1.0, by_unit ? params / double(std::max<int64_t>(1, units))
                                              : std::min(params, double(memory.setup.reduce_bucket_size)));
  const double buckets = std::max(1.0, std::ceil(params / bucket - 1e-9));
  auto seconds = [&](Collective kind, double bytes) {
    return buckets * cal.collective_seconds(kind, bytes / buckets, ranks, spans);
  };
  // What an overlapped collective still costs: what the compute it runs beside cannot hide, and
  // at least its exposed share (the cores it shares with the compute on CPU ranks).
  auto overlapped = [&](double comm, double window) { return std::max(comm - window, comm * cal.overlap_exposed.value); };
  // Stages 0-2: a bucket is reduced when full, during the backward; the last one after it (all
  // of them when the parameters fit one bucket).
  const double window = backward.work / cal.core_share() + backward.wait;
  auto in_backward = [&](double reduction) {
    return reduction / buckets + overlapped(reduction * (buckets - 1) / buckets, window);
  };
  const double reduce = seconds(Collective::reduce_scatter, g * params), gather = seconds(Collective::all_gather, c * params);
  switch (l.zero_stage) {
    case 0: return in_backward(seconds(Collective::all_reduce, g * params));
    case 1: return in_backward(reduce) + gather;
    case 2: return md * in_backward(reduce) + gather;
    // ZeRO-3 (overlap_comm): gathered for the forward and again for the backward of every
    // micro-batch, prefetched, and reduced in the backward; under a pipeline gathered once a
    // step before the stage's first forward (pipeline.zero3_gather "step", kept whole while the
    // stage runs), with nothing to hide behind.
    default: return l.pp > 1 ? overlapped(md * reduce, busy) + gather : overlapped(md * reduce + 2 * md * gather, busy);
  }
}

}  // namespace

StepCost predict_step(const Layout& l, const EstimateResult& memory, const Calibration& cal) {
  if (!memory.shape) throw std::invalid_argument("the planner times a transformer: give a preset or a shape");
  const TransformerShape& sh = *memory.shape;
  const int c = memory.setup.precision == "fp32" ? 4 : 2;
  const int64_t m = l.gradient_accumulation;
  const MoeConfig* moe = memory.setup.moe ? &*memory.setup.moe : nullptr;
  // The ep ranks exchanging tokens sit tp · cp apart inside the data axis (docs/moe.md).
  const bool experts_span_nodes = int64_t(l.ep) * l.cp * l.tp > memory.hardware.gpus_per_node;
  // The busiest stage: layers split evenly, the first stages taking the remainder; the head on the last.
  StageTimes busiest;
  int64_t busiest_first = 0, busiest_layers = sh.layers;
  auto total = [](const StageTimes& t) { return t.forward.work + t.forward.wait + t.backward.work + t.backward.wait; };
  for (int s = 0; s < l.pp; ++s) {
    const int64_t layers = sh.layers / l.pp + (s < sh.layers % l.pp ? 1 : 0);
    const int64_t first = s * (sh.layers / l.pp) + std::min<int64_t>(s, sh.layers % l.pp);
    int64_t moe_layers = 0;
    for (int64_t layer = first; moe && layer < first + layers; ++layer) moe_layers += (layer + 1) % moe->every == 0;
    const StageTimes t = stage_times(l, sh, layers, moe_layers, s == l.pp - 1, cal, c, memory.setup.context_method, moe,
                                     experts_span_nodes);
    if (total(t) > total(busiest)) busiest = t, busiest_first = first, busiest_layers = layers;
  }
  // Ranks that outnumber the node's cores share them: a rank's own work takes 1/share as long
  // when every rank is busy, but a rank idle in a pipeline bubble leaves its core to the others
  // (the pipeline below is timed with the cores shared among the ranks busy at each moment).
  const double share = cal.core_share();
  StepCost cost;
  const double md = double(m);
  cost.compute = md * busiest.compute / share;
  cost.recompute = md * busiest.recompute / share;
  cost.tensor = md * busiest.tensor;
  cost.context = md * busiest.context;
  cost.experts = md * busiest.experts;
  const double busy = cost.compute + cost.recompute + cost.tensor + cost.context + cost.experts;
  const double latency = cal.collective_latency_us.value * 1e-6;
  if (l.pp > 1) {
    // The layout's schedule on the node's shared cores (an interleaved or V chunk 1/v of the
    // stage's work, a split backward's B and W half of it each); what it adds beyond the stage's own work
    // is bubble and sends.
    const double send = latency + double(l.micro_batch * sh.seq_len / l.cp) * double(sh.hidden) * c /
                                      (cal.intra_node_gbps.value * 1e9);
    SharedCores cores;
    cores.ranks_per_stage = l.dp * l.cp * l.tp;
    cores.ranks_per_node = cal.ranks_per_node;  // all of them on emulated hosts
    cores.cores_per_node = cal.device == "cpu" ? cal.cores_per_node : 0;
    const pipeline::Schedule schedule = pipeline::make_schedule(l.schedule, l.pp, int(m), l.virtual_stages);
    const double without_sends = shared_core_makespan(schedule, busiest.forward, busiest.backward, 0.0, cores);
    const double with_sends = shared_core_makespan(schedule, busiest.forward, busiest.backward, send, cores);
    cost.bubble = std::max(0.0, without_sends - busy);
    cost.p2p = std::max(0.0, with_sends - without_sends);
  }
  // Folding each micro-batch's gradients into the fp32 buffers (docs/architecture.md): the new
  // gradient read, the buffer read and written, memory-bound.
  const double P = double(memory.params_per_gpu);
  cost.accumulate = md * (c + 8) * P / (cal.device_memory_gbps.value * 1e9);
  // An MoE model's experts on this stage's rank (its E/ep of each MoE layer's) are reduced and
  // partitioned over the (dp/ep) × cp ranks holding the same experts, the rest over dp × cp.
  double expert_params = 0;
  if (moe)
    for (const ParamTensor& t : transformer_tensors(sh, moe))
      if (t.expert >= 0 && t.expert < moe->num_experts / l.ep && t.layer >= busiest_first &&
          t.layer < busiest_first + busiest_layers)
        expert_params += double(t.numel);
  expert_params = std::min(expert_params, P);
  const int n = l.dp * l.cp, expert_n = l.dp / l.ep * l.cp;
  const bool dense_spans = int64_t(l.tp) * l.cp * l.dp > memory.hardware.gpus_per_node;
  cost.data = zero_collectives(l, P - expert_params, n, dense_spans, memory, cal, busiest.backward, busy, busiest_layers) +
              zero_collectives(l, expert_params, expert_n, dense_spans, memory, cal, busiest.backward, busy,
                               busiest_layers);
  // The optimizer step over this rank's shard (stage 0: every parameter), memory-bound.
  const double shard = l.zero_stage == 0 ? P : (P - expert_params) / n + expert_params / expert_n;
  const double k = memory.setup.optimizer == "SGD" ? (memory.setup.momentum > 0 ? 4 : 0) : 8;
  const double per_param = 12 + 2 * k + (c == 2 ? c : 0);
  if (l.offload_optimizer == "none") {
    cost.optimizer = shard * per_param / (cal.device_memory_gbps.value * 1e9);
  } else {
    // The gradient shard to the host (stage 1 once a step, later stages every micro-step), the
    // parameters back, the host step over the node's shards; NVMe: states read and written.
    const double pcie = cal.pcie_gbps.value * 1e9, ranks = cal.ranks_per_node;
    cost.offload += (l.zero_stage == 1 ? 1 : md) * 4 * shard / pcie + c * shard / pcie;
    cost.offload += ranks * shard * per_param / (cal.host_memory_gbps.value * 1e9);
    if (l.offload_optimizer == "nvme") cost.offload += ranks * shard * (16 + 2 * k) / (cal.nvme_gbps.value * 1e9);
  }
  if (l.offload_param != "none") {
    const double pcie = cal.pcie_gbps.value * 1e9;
    cost.offload += md * 2 * c * shard / pcie;
    if (l.offload_param == "nvme") cost.offload += md * 2 * cal.ranks_per_node * c * shard / (cal.nvme_gbps.value * 1e9);
  }
  return cost;
}

}  // namespace tessera::planner
