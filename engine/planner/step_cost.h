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
//   bubble       the pipeline's idle time: 1F1B timed by the schedule simulator
//                (parallel/pipeline/simulator.h) with the micro-batch's forward, backward and
//                send times: (p − 1)/(m + p − 1) of the makespan with equal stages
//   p2p          the activations and gradients sent between stages (inside the simulated makespan)
//   data         the ZeRO collectives over dp × cp (docs/zero.md): stage 0 allreduce 4Ψ, stage 1
//                reduce-scatter 4Ψ + allgather cΨ once a step, stage 2 the reduce-scatter every
//                micro-step, stage 3 also the allgather twice every micro-step
//   optimizer    the step over this rank's shard, memory-bound: (12 + 2k (+ c)) bytes a parameter
//   offload      the shard to the host and back, the host step, NVMe reads and writes
// The terms add: nothing overlaps (an upper bound where the engine overlaps, e.g. the gradients'
// reduce-scatter with the backward).
#pragma once

#include <string>

#include "engine/estimator/estimator.h"
#include "engine/planner/calibration.h"
#include "engine/planner/layout.h"

namespace tessera::planner {

struct StepCost {
  double compute = 0, recompute = 0, tensor = 0, context = 0, bubble = 0, p2p = 0, data = 0, optimizer = 0, offload = 0;
  double total() const { return compute + recompute + tensor + context + bubble + p2p + data + optimizer + offload; }
  // The largest term after the compute, by name ("bubble", "data", ...); "compute" when none is.
  std::string bound() const;
  nlohmann::json to_json() const;
};

// `memory`: the estimator's answer for this layout (its shape and parameters per rank). Throws
// std::invalid_argument without a transformer shape (nothing to time).
StepCost predict_step(const Layout& layout, const EstimateResult& memory, const Calibration& calibration);

// The pipeline's share of idle time for p stages and m micro-batches of equal cost under 1F1B:
// (p − 1)/(m + p − 1) (Narayanan et al. 2021).
double one_f_one_b_bubble(int stages, int micro_batches);

}  // namespace tessera::planner
