// The layouts the planner considers: every grid dp · tp · pp · cp of the world (for an MoE model,
// every expert degree ep that divides dp and the experts; under a pipeline 1F1B, ZB-H1 and
// interleaved 1F1B), every ZeRO stage
// and offload the engine runs, activation checkpointing off and on, and every micro-batch that
// divides the global batch's share of a data-parallel rank. What the model's shape rules out
// (tensor parallelism must divide the heads and the vocabulary, a stage needs a layer, context
// parallelism must divide the sequence, expert parallelism the experts) is rejected here with the reason; what fits and what the
// engine accepts is decided by the planner (engine/planner/planner.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/estimator/model_presets.h"
#include "engine/planner/layout.h"

namespace tessera::planner {

// What the search may vary. A fixed value (set) is the only one tried; the rest are searched.
struct SpaceLimits {
  std::optional<int> tp, pp, cp, ep, zero_stage;
  std::optional<int64_t> micro_batch;
  std::optional<std::string> offload_optimizer, offload_param, activation_checkpointing;
  std::optional<std::string> schedule;  // under a pipeline: "1f1b", "zb_h1", "interleaved_1f1b", "zb_v" (or "gpipe")
  int virtual_stages = 2;               // the interleaved schedule's model chunks a stage
  int max_tp = 0;                // 0: the ranks of one node (tensor parallelism stays inside a node)
  bool offload = true;           // try optimizer/parameter offload
  bool nvme = false;             // NVMe offload too (the hardware has a drive)
  bool context_parallel = true;  // try cp > 1 (needs a shape whose sequence divides)
  std::string context_method = "ulysses";
  int64_t num_experts = 0;       // the model's experts per MoE layer (0: dense; ep stays 1)
};

struct Rejection {
  Layout layout;       // the grid (and what else was decided when it was rejected)
  std::string reason;  // "tp 3 does not divide the 12 heads"
  std::string kind;    // "shape" | "batch" | "memory" | "unsupported"
};

// The grid's own rule for `shape` (empty: allowed): the example GPT's and tessera's kernels'.
std::string grid_rule(int tp, int pp, int cp, const std::string& context_method, const TransformerShape& shape);

// Every layout of `world` ranks (gpus_per_node to a node) for `global_batch`, shape-allowed;
// the grids the shape or the batch rules out go to `rejected`, one entry per grid.
std::vector<Layout> enumerate_layouts(int world, int gpus_per_node, int64_t global_batch,
                                      const std::optional<TransformerShape>& shape, const SpaceLimits& limits,
                                      std::vector<Rejection>* rejected);

std::vector<int> divisors(int64_t n);

}  // namespace tessera::planner
