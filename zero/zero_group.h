// One parameter group in the engine's flat buffers (zero/flat_layout.h has the byte layout,
// zero/buffer_plan.h the sizes): what ZeroOptimizer and the stage strategies share.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "optim/flat_optimizer.h"
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
  // The ranks its gradients are averaged over and its shards partitioned over (ParamGroup::
  // communicator: the data group unless the model names another), and at stage 3 a second group
  // over the same ranks for its parameter gathers.
  std::string comm_name = "data";
  Communicator* comm = nullptr;
  Communicator* gather_comm = nullptr;
  bool partitioned = false;        // stage 3: `compute` is this rank's shard; the model's tensors
                                   // are views into per-bucket buffers gathered around each use
  at::Tensor compute;              // flat, compute dtype: what the model reads (or the shard)
  at::Tensor master;               // fp32 local shard (mixed precision only; empty when in a file)
  bool master_on_file = false;     // NVMe optimizer offload moved the fp32 master shard to its file
  bool parameters_on_file = false; // NVMe parameter offload (stage 3): `compute`, the shard, is in its
                                   // file, and the segments' views of it are bound bucket by bucket
  at::Tensor grads;                // fp32: full flat (stages 0–1) or the local shard (stages 2–3)
  std::vector<at::Tensor> staging; // stages 2–3: a bucket's gradients while it fills
  std::vector<at::Tensor> gathered;  // stage 3, per bucket: its whole buffer (storage only while gathered)
  std::vector<int> pending;        // per bucket: parameters whose gradient has not arrived yet
  std::vector<bool> arrived;       // per parameter: its gradient arrived this micro-step
  std::vector<ShardSegment> segments;  // this rank's chunks as views: built once, buffers never move
  // offload_optimizer.device "cpu" on a GPU rank (ZeroOptions::host_optimizer): the optimizer
  // steps these instead, in pinned host memory: params the fp32 master chunk (`master`, or
  // `host_master` in fp32 training, where `segments` keep the device's fp32 values), grads the
  // host copy of the reduced gradient chunk (`host_grads`, copied when the bucket's reduction
  // completes), compute_copy the compute-dtype chunk (`host_compute`) that goes back to the device.
  std::vector<ShardSegment> host_segments;
  at::Tensor host_master, host_grads, host_compute;
  std::unique_ptr<FlatOptimizer> optimizer;
  double lr_scale = 1;
  double weight_decay = 0;
  bool mixed() const { return master.defined() || master_on_file; }
};

}  // namespace tessera
