// PartitionedParameters: ZeRO stage 3's parameters (Rajbhandari et al. 2020, P_os+g+p), gathered
// unit by unit around their use and released after it.
//
// Each rank keeps only its shard of a partitioned group's compute buffer (ZeroGroup::compute). The
// group's buckets never mix units (zero/flat_layout.h), so a unit's parameters are whole buckets:
// a SLOT is one bucket with its own full-size buffer (ZeroGroup::gathered), into which the model's
// tensors point for good. Gathering a slot allocates the buffer's storage, copies this rank's shard
// into its chunk and allgathers in place; releasing it frees the storage (into a pool of buffers by
// size, bounded by stage3_max_live_parameters, that later gathers reuse). Autograd's saved views
// share the storage, so a slot gathered again before a unit's backward is what that backward reads.
// The parameters themselves point, while released, at one NaN expanded to their shape (set_data):
// a read outside the units gives NaNs of the right shape, never freed memory; a gather points
// them back (autograd keeps the same tensor objects, so its saved leaves see the gathered data).
//
// With NVMe parameter offload the shard is in a file (offload/parameter_swapper.h): a gather first
// reads the bucket's chunk from it, synchronously, into its place in the whole buffer.
//
// Driven by the unit events (zero/units.h), on the data group's second communicator (gathers never
// queue behind gradient reductions, and a rank that reduces a bucket later cannot reorder them):
//   ForwardBegin(u)   gather u's slots (wait), then prefetch the next units' in the recorded order
//   ForwardEnd(u)     release u's slots, unless another open unit uses them, the unit's backward
//                     could not be seen coming (no output handed over), or, in training, their
//                     next use is within stage3_max_reuse_distance elements of gathers; then
//                     prefetch into the room the release made
//   BackwardBegin(u)  gather u's slots (wait), prefetch the units before it in forward order
//   BackwardEnd(u)    release the slots u owns: every gradient of its parameters has arrived, so no
//                     node left in this backward reads them (a tied parameter's slot stays until its
//                     owner's backward ends); then prefetch into the room made
// The order of units is recorded during the first forward; a forward that departs from it is
// re-recorded (with a warning on the first departure) and prefetches nothing until it is known.
// Each pass's order is checked to be the same on every data-parallel rank at the first unit of its
// backward (one small allgather; an error on every rank otherwise).
// Prefetch is bounded by stage3_prefetch_bucket_size elements in flight and, with what is gathered,
// by stage3_max_live_parameters.
//
// Until the model reports its first unit, every slot stays gathered (the model is whole after
// construction); a model that never reports units trains with whole parameters (the engine warns).
// A model built partitioned starts released, every slot gathered by its first use.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/parameter_swapper.h"
#include "parallel/communicator.h"
#include "zero/options.h"
#include "zero/units.h"
#include "zero/zero_group.h"

namespace tessera {

struct PartitionedOptions {
  int64_t prefetch_numel = ZeroSizeParams{}.stage3_prefetch_bucket_size;
  int64_t max_live_numel = ZeroSizeParams{}.stage3_max_live_parameters;
  int64_t max_reuse_distance = ZeroSizeParams{}.stage3_max_reuse_distance;
};

// Takes the bytes behind `buffer`'s storage (returned: dropping them frees them); tensors viewing it
// keep their sizes.
at::DataPtr release_storage(const at::Tensor& buffer);

class PartitionedParameters final : public UnitListener {
 public:
  // `groups`: every group of the engine (only partitioned ones are acted on); the model's tensors
  // point into their `gathered` buffers, which hold the whole values, or (start_released: a model
  // built partitioned, zero/partitioned_init.h) hold no bytes yet.
  // `swapper` (NVMe parameter offload, else null): where a group's shard is while its `compute`
  // buffer is empty (ZeroGroup::parameters_on_file); a gather reads the bucket's chunk from it.
  PartitionedParameters(Communicator& gather, const std::vector<ZeroGroup*>& groups, UnitTracker& units,
                        const PartitionedOptions& options, bool start_released = false,
                        ParameterSwapper* swapper = nullptr);
  ~PartitionedParameters() override;

  void on_unit_event(int unit, UnitEvent event) override;
  // The optimizer updated the shards: gathered copies are stale. Released (or, while the model has
  // reported no units, gathered again).
  void after_step();
  // A backward that threw: the slots it gathered go.
  void abort_backward();
  // A partitioned parameter read outside the units that list it (Python's module attribute access:
  // a tied weight read by the parent's forward): gathered now, and from now on counted as used by
  // the innermost open unit (gathered with it in forward and backward). Read where no unit is open,
  // it stays gathered until its owner's backward ends (or the step). Not partitioned: nothing.
  void fetch(const at::Tensor& param);
  // The model's whole forward ended; without grad (evaluation) nothing it gathered stays.
  void end_of_forward();
  // A model that reports no units but gathers its parameters itself (a pipeline stage: around its
  // batch, or around each forward and backward): partitioned from now on, every slot released until
  // gather_all().
  void partition_without_units();
  // Every slot gathered (refcounted: GatheredParameters scopes nest), and released again.
  void gather_all();
  void release_all();

  bool partitioned_mode() const { return partitioned_mode_; }
  int64_t live_numel() const { return live_numel_; }
  int64_t peak_live_numel() const { return peak_live_numel_; }
  int64_t pooled_bytes() const { return pooled_bytes_; }  // released buffers kept for the next gathers
  double take_wait_s();                          // seconds spent waiting for gathers since the last call

 private:
  enum class State { Released, InFlight, Live };
  struct Slot {
    ZeroGroup* group = nullptr;
    int bucket = 0;
    int owner = 0;  // the unit that owns its parameters
    int64_t numel = 0;
    State state = State::Live;
    bool prefetched = false;  // launched ahead of its unit (counts against the prefetch bound)
    CommHandle handle;
    std::vector<std::pair<at::Tensor, at::Tensor>> params;  // (the model's tensor, its view of the buffer)
  };

  void allocate_storage(const at::Tensor& buffer);
  void free_storage(const at::Tensor& buffer);
  void launch(int slot);
  void wait(int slot);
  void release(int slot);
  void need(int unit);  // gather every slot the unit uses, and wait
  void prefetch_after(size_t position, bool backward);
  bool used_by_open_unit(int slot, int except) const;
  int64_t reuse_distance(int slot, size_t position) const;
  void check_order_across_ranks();  // throws, on every rank, when the recorded orders differ

  Communicator& comm_;
  ParameterSwapper* swapper_;
  UnitTracker& units_;
  PartitionedOptions options_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> unit_slots_;  // [unit]: the slots its forward reads
  std::vector<char> open_;                    // [unit]: its forward is running
  std::vector<int> open_stack_;               // units whose forward is running, innermost last
  std::unordered_map<const void*, int> slot_of_;  // parameter (TensorImpl*) -> slot
  at::Tensor released_value_;                     // one NaN: what a released parameter reads
  std::unordered_map<size_t, std::vector<at::DataPtr>> pool_;  // released buffers by size in bytes
  int64_t pooled_bytes_ = 0;
  bool partitioned_mode_ = false;
  int gather_all_depth_ = 0;
  // The recorded order of ForwardBegin events, and where this pass is in it.
  std::vector<int> order_;
  bool order_known_ = false, warned_order_ = false;
  bool order_checked_ = false;  // this pass's order was checked across ranks (at its first backward unit)
  size_t cursor_ = 0;          // forward: the next position expected
  size_t backward_cursor_ = 0; // backward: one past the position of the last unit begun
  int64_t live_numel_ = 0, peak_live_numel_ = 0, in_flight_prefetch_ = 0;
  double wait_s_ = 0;
};

}  // namespace tessera
