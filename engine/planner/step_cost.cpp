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
                                                  {"bubble", bubble},       {"p2p", p2p},         {"data", data},
                                                  {"accumulate", accumulate}, {"optimizer", optimizer}, {"offload", offload}};
  const char* name = "compute";
  double most = 0;
  for (const auto& [n, v] : terms)
    if (v > most) most = v, name = n;
  return name;
}

json StepCost::to_json() const {
  return {{"total", total()}, {"compute", compute}, {"recompute", recompute}, {"tensor", tensor},
          {"context", context}, {"bubble", bubble}, {"p2p", p2p}, {"data", data},
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
  double compute = 0, recompute = 0, tensor = 0, context = 0;  // forward + backward
  StageOpCost forward, backward;                               // what the pipeline runs: work at a core's speed, waits
};

StageTimes stage_times(const Layout& l, const TransformerShape& sh, int64_t layers, bool head, const Calibration& cal,
                       int compute_bytes, const std::string& context_method) {
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
  if (head) work += cal.linear_seconds(tokens, h, sh.vocab / tp);
  StageTimes t;
  t.compute = work;  // the backward computes the gradients of inputs and weights: twice the forward
  if (l.activation_checkpointing == "full") t.recompute = double(layers) * layer / 3;
  const double latency = cal.collective_latency_us.value * 1e-6, bw = cal.intra_node_gbps.value * 1e9;
  const double activation = double(tokens) * double(h) * compute_bytes;
  if (l.tp > 1) {
    const double allreduce = cal.collective_seconds(Calibration::Collective::all_reduce, activation, int(tp), false);
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
  const double comm = t.tensor + t.context;
  t.forward = {work / 3, comm / 2};
  t.backward = {2 * work / 3 + t.recompute, comm / 2};
  return t;
}

}  // namespace

StepCost predict_step(const Layout& l, const EstimateResult& memory, const Calibration& cal) {
  if (!memory.shape) throw std::invalid_argument("the planner times a transformer: give a preset or a shape");
  const TransformerShape& sh = *memory.shape;
  const int c = memory.setup.precision == "fp32" ? 4 : 2;
  const int64_t m = l.gradient_accumulation;
  // The busiest stage: layers split evenly, the first stages taking the remainder; the head on the last.
  StageTimes busiest;
  auto total = [](const StageTimes& t) { return t.forward.work + t.forward.wait + t.backward.work + t.backward.wait; };
  for (int s = 0; s < l.pp; ++s) {
    const int64_t layers = sh.layers / l.pp + (s < sh.layers % l.pp ? 1 : 0);
    const StageTimes t = stage_times(l, sh, layers, s == l.pp - 1, cal, c, memory.setup.context_method);
    if (total(t) > total(busiest)) busiest = t;
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
  const double busy = cost.compute + cost.recompute + cost.tensor + cost.context;
  const double latency = cal.collective_latency_us.value * 1e-6;
  if (l.pp > 1) {
    // 1F1B on the node's shared cores; what it adds beyond the stage's own work is bubble and sends.
    const double send = latency + double(l.micro_batch * sh.seq_len / l.cp) * double(sh.hidden) * c /
                                      (cal.intra_node_gbps.value * 1e9);
    SharedCores cores;
    cores.ranks_per_stage = l.dp * l.cp * l.tp;
    cores.ranks_per_node = cal.ranks_per_node;  // all of them on emulated hosts
    cores.cores_per_node = cal.device == "cpu" ? cal.cores_per_node : 0;
    const pipeline::Schedule schedule = pipeline::one_f_one_b(l.pp, int(m));
    const double without_sends = shared_core_makespan(schedule, busiest.forward, busiest.backward, 0.0, cores);
    const double with_sends = shared_core_makespan(schedule, busiest.forward, busiest.backward, send, cores);
    cost.bubble = std::max(0.0, without_sends - busy);
    cost.p2p = std::max(0.0, with_sends - without_sends);
  }
  // Folding each micro-batch's gradients into the fp32 buffers (docs/architecture.md): the new
  // gradient read, the buffer read and written, memory-bound.
  const double P = double(memory.params_per_gpu);
  cost.accumulate = md * (c + 8) * P / (cal.device_memory_gbps.value * 1e9);
  // ZeRO's collectives over dp × cp (the ranks that hold the same parameters).
  const int n = l.dp * l.cp;
  if (n > 1) {
    using Collective = Calibration::Collective;
    const bool spans = int64_t(l.tp) * l.cp * l.dp > memory.hardware.gpus_per_node;
    const int g = memory.setup.communication_dtype == "bf16" || memory.setup.communication_dtype == "fp16" ? 2 : 4;
    auto seconds = [&](Collective kind, double bytes) { return cal.collective_seconds(kind, bytes, n, spans); };
    // What an overlapped collective still costs: what the compute it runs beside cannot hide, and
    // at least its exposed share (the cores it shares with the compute on CPU ranks).
    auto overlapped = [&](double comm, double window) {
      return std::max(comm - window, comm * cal.overlap_exposed.value);
    };
    // Stages 0-2: a bucket is reduced when full, during the backward; the last one after it (all
    // of them when the model fits one bucket: reduce_bucket_size).
    const double buckets = std::max(1.0, std::ceil(P / double(std::max<int64_t>(1, memory.setup.reduce_bucket_size))));
    const double backward = (busiest.backward.work / share + busiest.backward.wait);
    auto in_backward = [&](double reduction) {
      return reduction / buckets + overlapped(reduction * (buckets - 1) / buckets, backward);
    };
    const double reduce = seconds(Collective::reduce_scatter, g * P), gather = seconds(Collective::all_gather, c * P);
    switch (l.zero_stage) {
      case 0: cost.data = in_backward(seconds(Collective::all_reduce, g * P)); break;
      case 1: cost.data = in_backward(reduce) + gather; break;
      case 2: cost.data = md * in_backward(reduce) + gather; break;
      // ZeRO-3 (overlap_comm): gathered for the forward and again for the backward of every
      // micro-batch, prefetched, and reduced in the backward; under a pipeline gathered once a
      // step (pipeline.zero3_gather "step", kept whole while the stage runs).
      default: cost.data = overlapped(md * reduce + (l.pp > 1 ? 1.0 : 2 * md) * gather, busy); break;
    }
  }
  // The optimizer step over this rank's shard (stage 0: every parameter), memory-bound.
  const double shard = l.zero_stage == 0 ? P : P / n;
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
