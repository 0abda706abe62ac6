// The planner's prediction of one optimizer step's wall time for a layout, term by term
// (docs/planner.md states every formula). Unlike the estimator's option_cost, which ranks ZeRO and
// offload choices at fixed degrees per sample, this is a step time for the whole job and varies
// the grid:
//
//   compute      each micro-batch's forward (the busiest pipeline stage's matrix products at their
//                shapes, split by tp, its tokens by cp; attention's 4·s·h FLOPs per token and
//                layer) and backward (twice the forward)
//   recompute    full activation checkpointing: the layers' forward once more in the backward
//   tensor       tensor parallelism: 2 allreduces of a layer's activations in the forward, 2 in the
//                backward (Megatron's f and g), per layer and micro-batch
//   context      context parallelism: Ulysses's 4 all-to-alls forward and 4 backward per layer
//                (q, k, v and the output), or ring attention's cp − 1 key/value passes (twice in the backward)
//   experts      MoE layers (docs/moe.md): the experts' compute in place of the MLP is in compute
//                (this rank's E/ep experts, whole under tp, on the k rows a token routed to them);
//                here the 4 all-to-alls a layer and micro-batch over the ep ranks (dispatch and
//                combine, forward and backward)
//   bubble       the pipeline's idle time: its schedule (1F1B, ZB-H1, interleaved 1F1B) timed with
//                the micro-batch's forward, backward and
//                send times (shared_cores.h: on CPU nodes with more ranks than cores, the busy
//                ranks share the cores at each moment); (p − 1)/(m + p − 1) of the makespan with
//                equal stages and a core (device) per rank
//   p2p          the activations and gradients sent between stages (inside the simulated makespan)
//   data         the ZeRO collectives over dp × cp (docs/zero.md), each timed at its own probed
//                rate (an MoE model's experts over their own (dp/ep) × cp ranks):
//                stage 0 allreduce 4Ψ, stage 1 reduce-scatter 4Ψ + allgather cΨ once a step,
//                stage 2 the reduce-scatter every micro-step, stage 3 also the allgather twice every
//                micro-step. Stages 0-2 reduce a bucket when it fills in the backward: all but the
//                last overlap it; stage 3 prefetches its gathers and reduces in the backward: all
//                overlap the step's compute. An overlapped collective costs what the compute
//                cannot hide, and at least Calibration::overlap_exposed of its time
//   accumulate   each micro-batch's gradients folded into the fp32 buffers: (c + 8) bytes a
//                parameter, memory-bound
//   optimizer    the step over this rank's shard, memory-bound: (12 + 2k (+ c)) bytes a parameter
//   offload      the shard to the host and back, the host step, NVMe reads and writes
// The other terms add.
#pragma once

#include <string>

#include "engine/estimator/estimator.h"
#include "engine/planner/calibration.h"
#include "engine/planner/layout.h"

namespace tessera::planner {

struct StepCost {
  double compute = 0, recompute = 0, tensor = 0, context = 0, experts = 0, bubble = 0, p2p = 0, data = 0,
         accumulate = 0, optimizer = 0, offload = 0;
  double total() const {
    return compute + recompute + tensor + context + experts + bubble + p2p + data + accumulate + optimizer + offload;
  }
  // The largest term after the compute, by name ("bubble", "data", ...); "compute" when none is.
  std::string bound() const;
  nlohmann::json to_json() const;
};

// One rank's share of one layer under `layout` (tp splits its columns and heads, cp its tokens):
// the shape the probe times (Calibration::layer_seconds).
LayerShape layer_shape(const Layout& layout, const TransformerShape& shape);

// `memory`: the estimator's answer for this layout (its shape and parameters per rank). Throws
// std::invalid_argument without a transformer shape (nothing to time).
StepCost predict_step(const Layout& layout, const EstimateResult& memory, const Calibration& calibration);

// The pipeline's share of idle time for p stages and m micro-batches of equal cost under 1F1B:
// (p − 1)/(m + p − 1) (Narayanan et al. 2021).
double one_f_one_b_bubble(int stages, int micro_batches);

}  // namespace tessera::planner
