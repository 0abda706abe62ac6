// What the engine is told about a model: its parameters in optimizer groups, and its units.
//
// A model is an ordered list of named UNITS (the embedding, each block, the head): the pieces the
// engine can act on one at a time (gather and release them at ZeRO-3, cut them into pipeline
// stages, prefetch them from offload). Each unit lists the parameters it uses; a parameter listed
// by several units is SHARED (tied, e.g. the embedding and the LM head) and belongs to the first.
// A C++ model reports when a unit's forward starts and ends through Engine::unit(i); the Python
// binding does it with module hooks (python/tessera/engine.py). With no units given, the whole
// model is one unit.
//
// Parameter groups are the optimizer's (DeepSpeed's param_groups): their own lr and weight decay.
// A parameter with a tensor split holds only this rank's slice of a tensor-parallel weight: its
// gradient norm is summed over the tensor group; a replicated one is counted once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/flat_optimizer.h"
#include "parallel/tensor_parallel/tensor_split.h"

namespace tessera {

struct ParamGroup {
  std::vector<at::Tensor> params;  // leaf tensors; the engine re-points them into its flat buffer
  std::optional<double> lr;            // overrides optimizer.params.lr (a factor of the schedule)
  std::optional<double> weight_decay;  // overrides optimizer.params.weight_decay
  std::string name;
  std::vector<std::string> param_names;  // optional, one per parameter: named in errors
  // optional, one per parameter (default: replicated): how a tensor-parallel slice is cut from the
  // whole parameter (its norm is summed over the tensor group; a checkpoint records the cut)
  std::vector<TensorSplit> tensor_splits;
  // optional, one per parameter: its values as this rank's chunk (zero/partitioned_init.h) when it
  // was partitioned at construction and holds no bytes itself; undefined where it is whole
  std::vector<at::Tensor> shards;
  // The ranks this group's gradients are averaged over and its optimizer state (and at ZeRO-3 its
  // parameters) partitioned over, as ParallelContext::group_over names them: empty or "data" (the
  // default), a factor of a split data axis ("expert_data": parameters that differ across the other
  // factor, as experts do), or a product of axes ("data*context"). Not the tensor or pipe axes.
  std::string communicator;
  // Multiplies the group's averaged gradients (before the norm, clipping and the step). An MoE
  // layer's experts take 1/ep_size: the all-to-all brought them the tokens of the ep ranks, so each
  // rank's expert gradient already sums ep ranks' losses, and the average over the expert-data
  // group (dp/ep ranks) is then ep times the average over the data group that the dense
  // parameters get (parallel/moe/dispatch.h).
  double gradient_scale = 1.0;
};

// How errors and unit listings name parameter i of a group: its given name, else its place.
inline std::string param_name(const ParamGroup& g, size_t i) {
  return i < g.param_names.size() && !g.param_names[i].empty()
             ? g.param_names[i]
             : "group '" + g.name + "' parameter " + std::to_string(i);
}

struct ModelUnit {
  std::string name;                // "embedding", "blocks.3", "head"
  std::vector<at::Tensor> params;  // the parameters its forward uses (each one in some ParamGroup)
};

// A script's own optimizer, of a kind the engine does not have (Python: tessera.initialize(optimizer=
// torch.optim.Adagrad(...)), DeepSpeed's zero_allow_untested_optimizer): builds the optimizer of ZeRO
// group `group`, made of parameters of ParamGroup `source`, over this rank's shard `segments` (views
// that stay where they are for the engine's life).
using ClientOptimizerFactory = std::function<std::unique_ptr<FlatOptimizer>(
    int group, int source, const std::vector<ShardSegment>& segments, int64_t shard_numel)>;

struct ModelDescription {
  std::vector<ParamGroup> groups;
  std::vector<ModelUnit> units;  // in forward order; empty: one unit holding every parameter
  ClientOptimizerFactory client_optimizer;  // empty: the config's optimizer section
  // The model enters every unit it names in each forward (Engine::unit; the Python binding's hooks
  // do): at ZeRO-3 a model built whole then starts released, as one built under zero.Init does.
  // Left false, a model built whole stays whole until it first reports a unit.
  bool enters_units = false;
};

// Per-rank bytes held by the engine's own buffers (not activations), measured from the buffers.
struct MemoryReport {
  int64_t parameters = 0;        // compute-dtype parameters (the model's tensors)
  int64_t master_parameters = 0; // fp32 master slice (mixed precision only)
  int64_t gradients = 0;         // fp32 gradient accumulation (full, or this rank's slice)
  int64_t optimizer_states = 0;  // moments etc., this rank's slice
  int64_t buckets = 0;           // communication staging buffers
  // Stage 3: the most bytes of gathered parameters held at once so far (units' buffers; transient,
  // not in total()).
  int64_t gathered_parameters_peak = 0;
  int64_t gathered_parameters = 0;  // held now
  int64_t gathered_pool = 0;        // released buffers kept for the next gathers (≤ max_live)
  // NVMe optimizer offload: the bytes of optimizer state (and fp32 master) in this rank's files,
  // not in memory and not in total(); optimizer_states then counts only the tile buffers.
  int64_t offloaded_optimizer_bytes = 0;
  // NVMe parameter offload (stage 3): the bytes of this rank's parameter shards in its files.
  int64_t offloaded_parameter_bytes = 0;
  int64_t offload_read_bytes = 0, offload_written_bytes = 0;  // swapped so far, both kinds (cumulative)
  // offload_optimizer "cpu" on a GPU rank: the fp32 master, optimizer state and gradient copy in
  // pinned host memory (not the device's, not in total()).
  int64_t host_optimizer_bytes = 0;
  // offload_param "cpu" on a GPU rank (stage 3): the partitioned shards in host memory (not in
  // parameters, not in total()).
  int64_t host_parameter_bytes = 0;
  int64_t total() const { return parameters + master_parameters + gradients + optimizer_states + buckets; }
};

}  // namespace tessera
