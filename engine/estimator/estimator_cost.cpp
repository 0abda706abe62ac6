// The estimator's search cost model: what an option costs in speed (OptionCost,
// engine/estimator/estimator.h); docs/estimator.md states the same model.
#include <algorithm>
#include <optional>

#include "engine/estimator/estimator_detail.h"

namespace tessera::estimator_detail {

// What an option costs in speed: seconds per training sample on one GPU, at micro-batch
// s.micro_batch, as four terms that are summed (no overlap assumed between them: tessera overlaps
// its reduce-scatter with the backward and DeepSpeed prefetches ZeRO-3's gathers, so this is an
// upper bound on communication's share). The options that fit are ranked by the total; the report
// prints it relative to the compute (1.00 = nothing but forward + backward). tp and pp are the
// same for every option of one search, so their own communication and the pipeline bubble are
// left out. docs/estimator.md states the same model.
//
//  compute     forward + backward = 3 forward passes (the backward computes gradients of both
//              inputs and weights: 2x the forward's FLOPs). Forward FLOPs per token: per layer
//              2·(matrix parameters) + 4·s·h (QKᵀ and the attention-weighted sum of V, 2·s·h
//              each), plus 2·h·V for the LM head; per sample × s, per GPU ÷ (tp·pp).
//  recompute   full checkpointing: one more forward of every layer (not the head): about 1/3 of
//              the compute (Korthikanti et al. 2022: 530B GPT, 42.1% MFU with full recomputation
//              against 54.2% with selective recomputation and sequence parallelism, 29% slower).
//              selective (eager attention only): one more forward of the attention core, 4·s·h
//              per token per layer.
//  communication, the data-parallel collectives of tessera's engine (docs/zero.md), ring
//              algorithms, each moving (N-1)/N of its bytes over the slowest link of the group
//              (the inter-node rate when tp·dp spans more than one node), Ψ = parameters per GPU,
//              c = compute bytes:
//                stage 0: allreduce of the fp32 gradients, 2·4Ψ, once per optimizer step
//                stage 1: reduce-scatter of the fp32 gradients 4Ψ + allgather of the parameters
//                         cΨ, once per step
//                stage 2: reduce-scatter 4Ψ every micro-step, allgather cΨ once per step
//                stage 3: reduce-scatter 4Ψ + allgather cΨ in the forward and again in the
//                         backward, every micro-step (the parameters are never whole)
//              So ZeRO-3 moves 8Ψ per micro-step where ZeRO-2 moves 6Ψ: 4/3 as much with
//              tessera's fp32 gradient reduction, 3/2 with 16-bit gradients as in Rajbhandari et
//              al. 2020 §7 (3Ψ against 2Ψ), and ZeRO-2's allgather is once per step.
//  offload     offload_optimizer: the gradient shard 4Ψ/N to the host (stage 1 once per step,
//              stages 2-3 every micro-step) and the updated parameters cΨ/N back, over PCIe; the
//              CPU optimizer step over the node's shards, memory-bound at (12 + 2k + c) bytes per
//              parameter (Adam: read p, g, m, v, write p, m, v and the compute copy;
//              docs/cpu_adam.md); nvme: the node's master weights, states and gradients read and
//              written once per step, (16 + 2k)·Ψ/N per rank. offload_param: each rank's parameter
//              shard cΨ/N comes over PCIe for the forward and again for the backward (nvme: read
//              from the drive as well), every micro-step.
//  Per sample: per-micro-step seconds / micro-batch + per-step seconds / (micro-batch · gas).
OptionCost option_cost(const Hardware& hw, const std::optional<TransformerShape>& shape, int world, const TrainingSetup& s,
                       int64_t params_per_gpu) {
  OptionCost cost;
  const double flops = hw.gpu_tflops * 1e12;
  const double mb = double(s.micro_batch), gas = double(std::max<int64_t>(1, s.gradient_accumulation));
  if (shape) {
    const TransformerShape& sh = *shape;
    const double S = sh.seq_len, h = sh.hidden, kv = sh.kv_dim(), f = sh.ffn_dim();
    const double matrices = h * (h + 2 * kv) + h * h + (sh.mlp == "swiglu" ? 3 : 2) * h * f;
    const double attention = 4 * S * h;
    const double layer = 2 * matrices + attention;          // forward FLOPs per token and layer
    const double forward = sh.layers * layer + 2 * h * sh.vocab;
    const double per_gpu = S / (double(s.tp) * s.pp) / flops;  // seconds per (FLOP per token)
    cost.compute = 3 * forward * per_gpu;
    if (s.activation_checkpointing == "full") cost.recompute = sh.layers * layer * per_gpu;
    else if (s.activation_checkpointing == "selective") cost.recompute = sh.layers * attention * per_gpu;
  }
  const int dp = world / (s.tp * s.pp);
  const double P = double(params_per_gpu), c = compute_bytes(s), N = dp;
  if (dp > 1) {
    const bool spans = int64_t(s.tp) * dp > hw.gpus_per_node;
    const double bw = (spans ? hw.inter_node_gbps : hw.intra_node_gbps) * 1e9;
    auto ring = [&](double bytes) { return (N - 1) / N * bytes / bw; };  // reduce-scatter or allgather
    double m = 0, st = 0;
    if (s.zero_stage == 0) st = 2 * ring(4 * P);
    else if (s.zero_stage == 1) st = ring(4 * P) + ring(c * P);
    else if (s.zero_stage == 2) m = ring(4 * P), st = ring(c * P);
    else m = ring(4 * P) + 2 * ring(c * P);
    cost.communication = m / mb + st / (mb * gas);
  }
  const double shard = P / N, ranks = hw.gpus_per_node, pcie = hw.pcie_gbps * 1e9;
  double micro = 0, step = 0;  // offload seconds per micro-step, per optimizer step
  if (s.offload_optimizer != "none") {
    const double ratio = s.zero_stage == 3 ? s.offload_optimizer_ratio : 1.0, k = state_bytes_per_param(s);
    const double moved = shard * ratio;
    (s.zero_stage == 1 ? step : micro) += 4 * moved / pcie;                      // gradients to the host
    step += c * moved / pcie;                                                     // parameters back
    step += ranks * moved * (12 + 2 * k + (mixed_precision(s) ? c : 0)) / (hw.host_memory_gbps * 1e9);
    if (s.offload_optimizer == "nvme") step += ranks * moved * (16 + 2 * k) / (hw.nvme_gbps * 1e9);
  }
  if (s.offload_param != "none") {
    micro += 2 * c * shard / pcie;
    if (s.offload_param == "nvme") micro += 2 * ranks * c * shard / (hw.nvme_gbps * 1e9);
  }
  cost.offload = micro / mb + step / (mb * gas);
  return cost;
}

}  // namespace tessera::estimator_detail
