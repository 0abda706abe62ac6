// This rank's part of the engine's training state, as views into the engine's own buffers: what a
// save writes from and a load reads into (engine_checkpoint.h). Shared by save.cpp and load.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/checkpoint/metadata.h"

namespace tessera {
class Communicator;
class ParallelContext;
class ZeroOptimizer;
}  // namespace tessera

namespace tessera::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One parameter's elements [begin, begin + numel) held in this rank's shard.
struct PieceView {
  std::string name;
  std::vector<int64_t> shape;   // the parameter's (a tensor-parallel slice's own)
  at::ScalarType dtype;         // the model's
  int tensor_rank = -1;         // -1: whole on every tensor rank
  TensorSplit split;            // how the slice is cut from the whole (tensor_rank >= 0)
  int64_t begin = 0, numel = 0;
  NamedTensors states;          // "fp32", then the optimizer's Shard-layout states: 1-D views
  at::Tensor compute;           // the model's own dtype, mixed precision only
  NamedTensors per_parameter;   // PerParameter states: one-element views (begin == 0 pieces carry them)
};

// A parameter group's state that is not laid out by element.
struct GroupView {
  std::string first_parameter;  // names the group in a checkpoint
  int tensor_rank = -1;
  NamedTensors group_states;    // Group layout: the same on every rank (and the Uniform ones)
  std::vector<std::string> uniform;  // those of group_states that are the same in every group too
  NamedTensors rank_local;      // RankLocal: this rank's own
};

struct RankState {
  int pipeline_stage = 0;
  std::vector<std::string> shard_states;  // "fp32", ["compute"], the optimizer's Shard states
  std::vector<PieceView> pieces;          // every piece of this rank's shard
  std::vector<GroupView> groups;
  // Whether this rank writes its pieces and group states: one copy of each is saved (data rank 0
  // at ZeRO stage 0, where the replicas are equal; tensor rank 0 for replicated parameters).
  std::vector<bool> writes_piece;
  std::vector<bool> writes_group;
  // NVMe optimizer offload: per group index, the state arrays (and master) read from its swap file,
  // which the views above point into; a load writes them back (ZeroOptimizer::write_checkpoint_state).
  std::vector<std::pair<int, std::vector<at::Tensor>>> offloaded;
};

RankState rank_state(ZeroOptimizer& zero, ParallelContext& parallel);
// The layout the engine runs in now, with the Shard-layout states it holds.
Layout current_layout(TrainingState& state, const std::vector<std::string>& shard_states);

// The torch generators' states ("rng/cpu", and "rng/<device>" when the collectives' device is
// not the CPU), and their restoration from such a list.
NamedTensors rng_states(const c10::Device& device);
std::vector<std::string> rng_names(const c10::Device& device);
void set_rng_states(const c10::Device& device, const NamedTensors& states);

// Every rank's `text`, in rank order (a collective over `group`).
std::vector<std::string> all_gather_strings(Communicator& group, const std::string& text);

// Throws on every rank when any rank's `error` is not empty (a collective over `group`): ranks
// that failed rethrow their own message, the others name the first rank that failed.
void agree(Communicator& group, const std::string& error, const std::string& what);

}  // namespace tessera::checkpoint
