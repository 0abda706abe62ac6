// One parameter group in the engine's flat buffers (zero/flat_layout.h has the byte layout,
// zero/buffer_plan.h the sizes): what ZeroOptimizer and the stage strategies share.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/flat_optimizer.h"
#include "parallel/tensor_parallel/tensor_split.h"
#include "zero/flat_layout.h"

namespace tessera {

class Communicator;

struct ZeroGroup {
  int index = 0;                   // in the engine's list of groups (its staging pool)
  int source_group = 0;            // the model's group it came from (ModelDescription::groups)
  FlatLayout layout;
  std::vector<at::Tensor> params;  // the model's tensors, now views into `compute`
  std::vector<std::string> names;  // for error messages
  std::vector<int> unit_of;        // per parameter: the unit that owns it (zero/units.h), -1 if none
  bool tensor_sharded = false;     // its parameters are tensor-parallel slices (zero/model.h)
  std::vector<TensorSplit> tensor_splits;  // per parameter: how its slice is cut (checkpoints record it)
  // The ranks its gradients are averaged over and its shards partitioned over (ParamGroup::
  // communicator: the data group unless the model names another), and at stage 3 a second group
  // over the same ranks for its parameter gathers.
  std::string comm_name = "data";
  Communicator* comm = nullptr;
  Communicator* gather_comm = nullptr;
  bool partitioned = false;        // stage 3: `compute` is this rank's shard; the model's tensors
                                   // are views into per-bucket buffers gathered around each use
  at::Tensor compute;              // flat, compute dtype: what the model reads (or the shard)
  bool mixed_precision = false;    // the compute dtype is not fp32: an fp32 master shard exists
  at::Tensor master;               // fp32 local shard (mixed precision; undefined where a StateSite
                                   // keeps it elsewhere: zero/residence.h)
  at::Tensor grads;                // fp32: full flat (stages 0–1) or the local shard (stages 2–3)
  std::vector<at::Tensor> staging; // stages 2–3: a bucket's gradients while it fills
  std::vector<at::Tensor> gathered;  // stage 3, per bucket: its whole buffer (storage only while gathered)
  std::vector<int> pending;        // per bucket: parameters whose gradient has not arrived yet
  std::vector<bool> arrived;       // per parameter: its gradient arrived this micro-step
  // This rank's chunks as views, built once. Their parameter views may be unbound while the shard
  // is in a file (ParameterSite), and the fp32 ones while the master is (StateSite).
  std::vector<ShardSegment> segments;
  std::unique_ptr<FlatOptimizer> optimizer;
  double lr_scale = 1;
  double gradient_scale = 1;  // ParamGroup::gradient_scale
  double weight_decay = 0;
  bool mixed() const { return mixed_precision; }
  // The invariants every residence keeps (sizes of the buffers against the layout); throws
  // std::logic_error naming the first one broken.
  void check() const;
};

using Groups = std::vector<std::unique_ptr<ZeroGroup>>;
using BucketOrder = std::vector<std::pair<int, int>>;  // (group, bucket)

}  // namespace tessera
