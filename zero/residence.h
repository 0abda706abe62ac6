// Where a ZeRO group's shards live, and what a bucket needs around the optimizer step. Three
// independent choices, each a strategy that owns its buffers and fields (ZeroGroup keeps only what
// every choice has; docs/architecture.md draws them):
//
//   StepSite       where the optimizer steps: on the group's own buffers (CPU ranks; GPU ranks
//                  without offload: InPlaceStep), or on copies in host memory (GPU ranks with
//                  offload_optimizer, ZeRO-Offload, Ren et al. 2021: HostStep — a bucket's gradient
//                  chunk goes to the host when its reduction completes, the updated chunk comes
//                  back before its allgather)
//   StateSite      where the optimizer state (and the fp32 master with mixed precision) lives: held
//                  by the optimizer in memory (StateInMemory), or in NVMe files streamed through
//                  tile buffers (StateInFiles, offload/optimizer_swapper.h; ZeRO-Infinity,
//                  Rajbhandari et al. 2021)
//   ParameterSite  where a ZeRO-3 group's parameter shard lives: in memory, the device's or (GPU
//                  ranks with offload_param cpu) the host's (ParametersInMemory), or in NVMe files
//                  read around each gather and each bucket's step (ParametersInFiles,
//                  offload/parameter_swapper.h)
//
// ZeroOptimizer::apply() is one loop over buckets whatever they are: the StateSite drives it
// (a tile at a time from the files, or a bucket at a time in memory), each bucket bound by the
// ParameterSite (its chunk swapped in), stepped where the StepSite says, then unbound and sent on.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "offload/parameter_swapper.h"
#include "zero/model.h"
#include "zero/zero_group.h"

namespace tessera {


// ---- where the optimizer steps ---------------------------------------------------------------
class StepSite {
 public:
  virtual ~StepSite() = default;
  // Options for the buffers the step reads and writes: the fp32 master shard, the optimizer's state.
  virtual at::TensorOptions master_options(const at::TensorOptions& device_f32) const { return device_f32; }
  virtual at::TensorOptions state_options(const at::TensorOptions& device_f32) const { return device_f32; }
  // Options for a ZeRO-3 group's parameter shard (the host's with offload_param cpu on GPU ranks).
  virtual at::TensorOptions shard_options(const at::TensorOptions& device, bool partitioned) const { return device; }
  // Whether g's parameter shard is host memory that the step writes in place (offload_param cpu,
  // or the swap buffer an NVMe shard's chunk is bound to with offload_param nvme).
  virtual bool holds_shard(const ZeroGroup& g) const { return false; }
  // The ParameterSite bound g's shard views anew (a chunk swapped in from its file, or the whole
  // shard brought in; `bucket` -1: every bucket): a site that steps the shard in place follows them.
  virtual void follow_shard(ZeroGroup& g, int bucket) {}
  // After g's device segments exist: its own buffers (HostStep: the host copies and their segments).
  virtual void add_group(ZeroGroup& g, at::ScalarType gradient_dtype, at::ScalarType compute_dtype) {}
  // The segments the optimizer steps for g.
  virtual const std::vector<ShardSegment>& segments(const ZeroGroup& g) const { return g.segments; }
  // A bucket's reduced gradient chunk is final for this step.
  virtual void gradient_final(ZeroGroup& g, int bucket) {}
  // Gradients straight to the host (stages 2–3): the host's copy of a bucket's gradient chunk,
  // where each micro-step's reduced chunk goes (undefined: the site keeps no host copy).
  virtual at::Tensor host_gradient(ZeroGroup& g, int bucket) { return {}; }
  // Before the optimizer reads what gradient_final() queued.
  virtual void before_step() {}
  // The step about to start runs while the next backward goes on (a delayed parameter update):
  // it keeps reading the gradients queued so far, and gradient_final() queues the next backward's
  // into a second buffer (HostStep; the others have no delayed step).
  virtual void keep_gradients_for_delayed_step() {
    throw std::logic_error("tessera: a delayed parameter update needs the optimizer on the host");
  }
  // A bucket was stepped: its updated chunk goes where the model reads it (before its allgather).
  virtual void after_bucket(ZeroGroup& g, int bucket) {}
  // g's values changed outside a step (a load, write_back_parameters): its copies follow.
  virtual void values_changed(ZeroGroup& g) {}
  // The fp32 master moved to a file: the views that held it alive let go.
  virtual void release_master_views(ZeroGroup& g) {}
  // Before the host writes its buffers outside a step: queued device reads of them are done.
  virtual void wait_for_readers() {}
  // g's master, state and own copies in the report (the device's, or the host's).
  virtual void add_memory(const ZeroGroup& g, MemoryReport& m) const;
  virtual bool on_host() const { return false; }
};

std::unique_ptr<StepSite> make_in_place_step();
// `device`: the data group's; `pinned`: offload_optimizer.pin_memory (asynchronous copies);
// `shards_on_host`: offload_param cpu or nvme at ZeRO-3 (a partitioned group's shard, in host
// memory or bound from its file, is the host copy).
std::unique_ptr<StepSite> make_host_step(c10::Device device, bool pinned, bool shards_on_host);

// ---- where the optimizer state lives ---------------------------------------------------------
// One piece of a bucket stepped with its state arrays (empty: the optimizer holds its state).
using StepPiece = std::function<void(int group, const ShardSegment& piece, const std::vector<at::Tensor>& state)>;
using BindBucket = std::function<ShardSegment(int group, int bucket)>;
using BucketDone = std::function<void(int group, int bucket)>;

// A group's optimizer state as a checkpoint reads it: the optimizer's named state with the arrays
// from the files where they are there, and the fp32 master shard when it is in a file too
// (undefined: the segments' `params` hold it).
struct CheckpointState {
  std::vector<std::pair<std::string, at::Tensor>> named;
  at::Tensor master;
  std::vector<at::Tensor> arrays;  // what the files held (a load writes them back: write_state)
  bool from_files = false;
};

class StateSite {
 public:
  virtual ~StateSite() = default;
  // Whether the optimizers are built without state (it is in the files).
  virtual bool in_files() const { return false; }
  // After every group is built: takes the state and master where they go.
  virtual void attach(Groups& groups, StepSite& site) {}
  // Steps these buckets in this order: each bound, stepped piece by piece, then done.
  virtual void step(const BucketOrder& order, const BindBucket& bind, const StepPiece& step, const BucketDone& done);
  // Writes `values` (fp32, a bucket's chunk) as g's master.
  virtual void write_master(ZeroGroup& g, int bucket, const at::Tensor& values);
  // After a load wrote the master in memory: the compute copy follows it.
  virtual void compute_follows_master(ZeroGroup& g);
  virtual CheckpointState read(const ZeroGroup& g);
  // A checkpoint's arrays (in the optimizer's state order, the master last when in the file).
  virtual void write(ZeroGroup& g, const std::vector<at::Tensor>& arrays);
  virtual bool master_in_file(const ZeroGroup& g) const { return false; }
  virtual void add_memory(MemoryReport& m) const {}
};

std::unique_ptr<StateSite> make_state_in_memory();
std::unique_ptr<StateSite> make_state_in_files(const OptimizerSwapOptions& options);

// ---- where a ZeRO-3 group's parameter shard lives --------------------------------------------
class ParameterSite {
 public:
  virtual ~ParameterSite() = default;
  // After every group is built: the partitioned groups' shards go where they live.
  virtual void attach(Groups& groups) {}
  // Whether g's shard is in a file outside a ResidentParameters scope.
  virtual bool in_files(const ZeroGroup& g) const { return false; }
  // Around a bucket's step: its chunk bound to the segment's views, and written back behind.
  virtual void bind(ZeroGroup& g, int bucket) {}
  virtual void unbind(ZeroGroup& g, int bucket) {}
  // A step failed: the chunks swapped in are let go unwritten.
  virtual void abandon(Groups& groups) {}
  // Runs `step` with g's whole shard in memory (LAMB's trust ratios need whole parameters).
  virtual void with_group_resident(ZeroGroup& g, const std::function<void()>& step) { step(); }
  // Every shard in memory while a ResidentParameters scope lives (scopes nest); `modifies`
  // false: only read, not written back.
  virtual void bring_in(Groups& groups, bool modifies) {}
  virtual void put_back(Groups& groups) {}
  // Writes `values` as a bucket's chunk of a partitioned group's shard.
  virtual void write(ZeroGroup& g, int bucket, const at::Tensor& values);
  // The writes queued above have landed (a failed one throws).
  virtual void wait_writes() {}
  virtual ParameterSwapper* swapper() { return nullptr; }
  virtual void add_memory(MemoryReport& m) const {}
};

std::unique_ptr<ParameterSite> make_parameters_in_memory();
// `buffers_on_host`: the swap buffers are host memory beside a device (GPU ranks' host path), so
// the memory report counts them as the host's.
std::unique_ptr<ParameterSite> make_parameters_in_files(const ParameterSwapOptions& options, bool buffers_on_host);

}  // namespace tessera
