// ZeroOptimizer: the engine's flat buffers and what happens to gradients and parameters in one
// step, for ZeRO stages 0–3 (Rajbhandari et al. 2020); stage 3's gathers around each unit are
// PartitionedParameters' (zero/partitioned_parameters.h). The sizes come from the buffer
// planner (zero/buffer_plan.h, docs/zero.md); what differs by stage is a strategy
// (zero/zero_stage.h); this class does what is common to them:
//
//   construction  plan, allocate, fill from data-parallel rank 0's tensors (broadcast), re-point
//                 the model's tensors into the compute buffer, install the gradient hooks
//   backward      each parameter's gradient is folded, as soon as autograd has produced it (a
//                 post-accumulate-grad hook), into the stage's fp32 buffers and released; a bucket
//                 whose parameters have all arrived is reduced asynchronously while backward goes
//                 on, in one fixed order on every rank
//   step          the engine reads gradient_parts() for the norm (optim/grad_norm.h; each part's
//                 norm was taken when its bucket's reduction completed on the boundary micro-step,
//                 so the step makes no second pass over the gradients), then calls apply() (the
//                 optimizer on this rank's shard) and gather_parameters()
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <future>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "offload/optimizer_swapper.h"
#include "offload/parameter_swapper.h"
#include "optim/grad_norm.h"
#include "optim/options.h"
#include "zero/buffer_plan.h"
#include "zero/model.h"
#include "zero/options.h"
#include "zero/partitioned_parameters.h"
#include "zero/reductions.h"
#include "zero/residence.h"
#include "zero/speculative_step.h"
#include "zero/units.h"
#include "zero/zero_group.h"
#include "zero/zero_stage.h"

namespace tessera {

class ParallelContext;

// What ZeRO takes from the config (the engine fills it: engine/engine.cpp).
struct ZeroOptions {
  int stage = 0;
  // Stages 1–2 (zero_optimization.overlap_comm): when the model reports its units, the allgather
  // of the updated parameters is not waited for at the end of the step but by each unit's forward
  // (zero/units.h), so it overlaps the next forward; wait_for_parameters() before other reads.
  bool overlap_allgather = false;
  // Stages 1–2 (zero_optimization.reduce_scatter): false allreduces each bucket instead (twice the
  // bytes; DeepSpeed's switch for backends whose reduce-scatter is slow or missing).
  bool reduce_scatter = true;
  // communication_data_type: the dtype gradients travel in (fp32 accumulation either way).
  at::ScalarType communication_dtype = at::kFloat;
  // gradient_predivide_factor (prescale_gradients: the data-parallel size); 1: average after.
  double predivide_factor = 1.0;
  // data_types.grad_accum_dtype: the whole-gradient buffer's dtype at stages 0–1 (fp32 or bf16).
  at::ScalarType gradient_dtype = at::kFloat;
  int64_t reduce_bucket_numel = ZeroSizeParams{}.reduce_bucket_size;
  bool ignore_unused_parameters = true;
  at::ScalarType compute_dtype = at::kFloat;
  std::string optimizer = "Adam";  // Adam, AdamW, SGD, Lamb
  OptimizerHyperparams hyper;
  // Stage 3: parameters of fewer elements than this stay whole on every rank
  // (stage3_param_persistence_threshold), and the gathers' bounds (zero/partitioned_parameters.h).
  int64_t persistence_threshold = ZeroSizeParams{}.stage3_param_persistence_threshold;
  PartitionedOptions partitioned;
  // offload_optimizer.device "nvme": the optimizer states (and the fp32 master with mixed
  // precision) in files, streamed through tile buffers at each step (offload/optimizer_swapper.h).
  std::optional<OptimizerSwapOptions> nvme_optimizer;
  // offload_param.device "nvme" (stage 3): each rank's shard of the partitioned parameters in files,
  // read just before a bucket's gather and around its optimizer step (offload/parameter_swapper.h).
  std::optional<ParameterSwapOptions> nvme_parameters;
  // offload_optimizer.device "cpu" on GPU ranks (ZeRO-Offload, Ren et al. 2021): the fp32 master
  // shard, the optimizer state and a copy of the gradient shard live in pinned host memory; each
  // bucket's gradient chunk goes to the host when its reduction completes (while backward goes
  // on), the CPU kernel steps it, and the updated chunk goes back in the compute dtype,
  // asynchronously, while the CPU steps the next one. On CPU ranks "cpu" is where things are.
  // With "nvme" the same host path, the state (and the master with mixed precision) in files.
  bool host_optimizer = false;
  // CPU ranks take the GPU ranks' host path anyway (separate host copies of the shards, the copies
  // between them CPU to CPU), so that path's bookkeeping is tested without a GPU
  // (TESSERA_HOST_STAGING=1; see docs/offload.md).
  bool host_staging_on_cpu = false;
  // offload_param.device "cpu" on GPU ranks (stage 3, with host_optimizer): each partitioned
  // group's shard lives in host memory, where it is also the host optimizer's copy (no second
  // one); a bucket's chunk goes to the device into its slot of the gathered buffer just before
  // the allgather.
  bool host_parameters = false;
  // offload_optimizer.pin_memory: those host buffers page-locked, so the copies are asynchronous
  // (false: pageable memory, each copy waits for the device).
  bool host_pinned = false;
  // offload_optimizer.delayed_param_update (ZeRO-Offload's DPU, Ren et al. 2021 §5; host_optimizer
  // only): from applied step delayed_update_after + 1 on, apply() starts the host step on a thread
  // of its own and returns; the next forward and backward run on the parameters as they were, and
  // the next apply() (or anything that reads the parameters) first sends the result to the model.
  // -1: every step applied before apply() returns.
  int64_t delayed_update_after = -1;
  // offload_optimizer.super_offload (host_optimizer only; zero/speculative_step.h): on the boundary
  // micro-step each bucket's chunk is stepped on the host, on a thread of its own, as soon as its
  // reduced gradient is there, while the backward goes on; apply() keeps those steps when its
  // inputs are the ones speculate_step() announced, and restores and redoes them otherwise.
  bool speculative_step = false;
  double speculation_threads_share = 0.8;  // offload_optimizer.cpuadam_cores_perc: of the rank's threads
  SpeculationFault speculation_fault = SpeculationFault::None;  // tests only (TESSERA_TEST_SPECULATION_FAULT)
};

// fp32 state elements per shard element of an optimizer (what the planner reserves).
int64_t optimizer_state_floats(const std::string& optimizer, const OptimizerHyperparams& hyper);

class ZeroOptimizer final : public UnitListener {
 public:
  // `units` (may be null) hears of every parameter gradient, to track the units' backward.
  ZeroOptimizer(const ZeroOptions& options, ParallelContext& parallel, ModelDescription& model,
                UnitTracker* units = nullptr);
  ~ZeroOptimizer() override;

  const BufferPlan& plan() const { return plan_; }
  int stage() const { return stage_->number(); }
  // The optimizer's phase for the progress line (optim/flat_optimizer.h's phase(); empty for most).
  std::string optimizer_phase() const;
  // Every group's optimizer state by name, "group.name" (FlatOptimizer::named_state).
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;

  // Whether the coming backward ends a gradient accumulation (stages 0/1 communicate only then);
  // `next_step`: the StepInputs::step of the optimizer step it leads to (the 1-bit family decides by
  // it whether the gradients are averaged).
  void begin_backward(bool boundary, int64_t next_step = 1);
  // After autograd: launch the buckets still waiting (parameters with no gradient count as zero),
  // in the fixed order, and wait for every reduction. With ignore_unused_parameters false, a
  // parameter without a gradient is an error naming it.
  void end_backward();
  // After autograd threw (a caught KeyboardInterrupt, out of memory): waits for the reductions
  // already launched, resets the bucket counters and discards the gradients accumulated since the
  // last optimizer step (they mix the interrupted micro-step in), so the next backward starts clean.
  void abort_backward();

  // Waits for every reduction still in flight.
  void wait_for_gradients() { reductions_.wait_all(); }
  // After a boundary backward: sums the model's group `group`'s (ModelDescription::groups) reduced gradients (this rank's chunks, which
  // line up on every member: the group's layout is the same there) over `across`, the pipeline
  // stages that hold the same weights (pipeline/tied weights); `counted_here` false leaves them out
  // of this rank's norm (the owning stage counts them).
  void sum_group_gradients(int group, Communicator& across, bool counted_here);
  // This rank's reduced gradients (still loss-scaled), flagged for the norm's reductions, each with
  // its norm once its bucket's reduction has completed in a backward that ends an accumulation.
  const std::vector<GradPart>& gradient_parts() const { return grad_parts_; }
  // The optimizer on this rank's shard with the gradients multiplied by `grad_scale` (1/loss scale
  // × the clipping coefficient); writes the compute copy of this rank's chunks. At stages 1–2 the
  // allgather of a bucket starts as soon as its chunk is updated (buckets in the order the next
  // forward reads them: by unit), so it overlaps the optimizer on the next one.
  // With delayed_update_after, a later step is only started here (see ZeroOptions); the step
  // started last time is finished first.
  void apply(double grad_scale, const StepInputs& inputs);
  // super_offload: the inputs apply() will get unless clipping or an overflow intervenes (the
  // engine's, with the clipping coefficient 1), given after begin_backward() of a boundary
  // micro-step; each bucket's chunk is stepped with them as its gradient reaches the host.
  bool speculates_steps() const { return speculation_ != nullptr; }
  void speculate_step(double grad_scale, const StepInputs& inputs);
  SpeculativeStep::Counts speculation_counts() const;
  // A delayed step still running: waits for it and sends its chunks where the model reads them
  // (each bucket's allgather launched). wait_for_parameters() does this first.
  void finish_delayed_step();
  // Each model group's learning rate (ModelDescription::groups), used by apply() instead of
  // inputs.lr × the group's factor; empty (the default): the factor applies.
  void set_group_learning_rates(std::vector<double> lrs);
  const std::vector<double>& group_learning_rates() const { return group_lrs_; }
  // Every rank gets every updated chunk (stages 1–2): waits for the allgathers now, or, with
  // overlap_allgather and a model that reports its units, leaves each to the forward of the
  // first unit that uses it.
  void gather_parameters(bool model_reports_units);
  // Finishes a delayed step, undoes a speculated one that apply() has not taken yet, and waits for
  // every allgather still in flight: the parameters (and the optimizer state) are final after it.
  void wait_for_parameters();
  // Waits for the allgathers in flight only (a delayed step goes on).
  void wait_for_gathers();
  bool parameters_in_flight() const { return !gathers_.empty(); }
  // Seconds spent waiting for allgathers since the last call (the progress line's allgather wait):
  // stages 1–2's of updated parameters, and stage 3's gathers before a unit's forward or backward.
  double take_allgather_wait_s() {
    return std::exchange(allgather_wait_s_, 0.0) + (partitioned_ ? partitioned_->take_wait_s() : 0.0);
  }
  // A unit's forward begins: its parameters' allgathers must be done.
  void on_unit_event(int unit, UnitEvent event) override;
  void zero_grad();
  MemoryReport memory() const;
  // The model's tensors were modified on data-parallel rank `root` (DeepSpeed's GatheredParameters
  // with modifier_rank; at stage 3 inside a gather of every slot): every rank takes root's values
  // into its buffers, shards and fp32 master copy, so the optimizer continues from them.
  void write_back_parameters(int root);
  // Stage 3 (null otherwise): the partitioned parameters' gathers.
  PartitionedParameters* partitioned() { return partitioned_.get(); }

  // Checkpoints (engine/checkpoint/) read and write this rank's shard through the groups: each
  // segment's `params` are the fp32 values of its chunk (the master, or the compute buffer in fp32
  // training), the optimizer's named state is laid out like the shard.
  const std::vector<std::unique_ptr<ZeroGroup>>& groups() const { return groups_; }
  int shard_rank(const ZeroGroup& g) const { return stage_->shard_rank(g); }
  // Whether some group is reduced over a communicator other than the data group (ParamGroup::communicator).
  bool has_groups_of_their_own() const;
  // Group `group`'s optimizer state for a checkpoint, wherever it lives (zero/residence.h's
  // StateSite): the named state, from the files with NVMe offload (then also the fp32 master when
  // it is in the file, and the arrays to write back after a load).
  CheckpointState checkpoint_state(int group) { return state_->read(*groups_.at(group)); }
  // A loaded checkpoint's arrays back where the state lives (NVMe: the files; the compute copy
  // follows a master in the file).
  void write_checkpoint_state(int group, const std::vector<at::Tensor>& arrays);
  // After a checkpoint wrote this rank's fp32 chunk values and optimizer state: the compute copy
  // of its chunks follows them, every rank gets every chunk (stages 1–2), ZeRO-3's gathered copies
  // are stale, and the gradients start from zero.
  void after_shards_loaded();
  // Before a checkpoint load writes the host buffers outside a step: the device's reads of them
  // still queued (a gather from a shard in host memory, a copy to the device) have finished.
  void wait_for_host_readers();
  // Before a checkpoint's optimizer state is loaded: every group's optimizer has its state arrays
  // (FlatOptimizer::materialize_state; a client torch optimizer makes them at its first step).
  bool materialize_optimizer_state();           // whether some group made state now
  void discard_materialized_optimizer_state();  // the load failed: what materialize made goes

  // NVMe parameter offload: every partitioned group's shard in memory (its `compute` buffer and the
  // segments' views, as without offload) while a scope lives, written back to the files at its end,
  // for what reads or writes the shard whole (a checkpoint, LAMB's step). Scopes nest; without
  // parameter offload they do nothing.
  class ResidentParameters {
   public:
    // `modifies` false: the shards are only read (a checkpoint's save), so not written back.
    explicit ResidentParameters(ZeroOptimizer& zero, bool modifies = true);
    ~ResidentParameters() noexcept(false);
    ResidentParameters(const ResidentParameters&) = delete;
    ResidentParameters& operator=(const ResidentParameters&) = delete;

   private:
    ZeroOptimizer& zero_;
    int exceptions_ = 0;
  };

  // Called by the gradient hooks.
  void on_grad_ready(int group, int param, const at::Tensor& grad);

 private:
  void launch_ready_buckets();
  bool reduces_now() const;  // whether this backward's complete buckets are reduced as they fill
  // part.norm from `grads`, its gradients as they are now (its own view, or on the host path the
  // reduced chunk passing through).
  void take_norm(GradPart& part, const at::Tensor& grads) const;
  GradPart gradient_part(const ZeroGroup& g, const at::Tensor& grads) const;  // flagged for the norm
  // grad_parts_[i]'s gradients are final for this step: its norm, and the step site's (a host copy).
  void gradient_final(size_t i);
  // Whether group g is stepped in one call rather than bucket by bucket: an optimizer that needs
  // whole parameters (LAMB), or a group in memory whose chunks are not gathered after the step.
  bool steps_whole(const ZeroGroup& g) const;
  void step_group(ZeroGroup& g, const StepInputs& in);
  // Each group's inputs: `inputs` with the group's learning rate and weight decay, and `grad_scale`.
  std::vector<StepInputs> group_inputs(double grad_scale, const StepInputs& inputs) const;
  // Steps every bucket (in[g] for group g) but those already `stepped` ([group][bucket]; empty:
  // none), finishing each as it is done, or, with `finish` false, leaving that to finish_delayed_step().
  void step_buckets(const std::vector<StepInputs>& in, bool finish, const std::vector<std::vector<char>>& stepped = {});
  // super_offload: which groups are speculated (elementwise optimizers whose chunks the step
  // writes in host memory the model does not read meanwhile), and the speculation over them.
  void make_speculation(const ZeroOptions& options);
  // A bucket was stepped: written back where its shard lives, sent where the model reads it, and
  // its allgather launched (stages 1–2).
  void finish_bucket(ZeroGroup& g, int bucket);
  void reduce(size_t launch_index);  // launch_order_[launch_index]; its norm once done on a boundary
  void reset_bucket_counters();
  std::string unused_parameters() const;
  // Construction, group by group (zero_optimizer_build.cpp).
  void choose_residence(const ZeroOptions& options);
  void allocate_group(ZeroGroup& g, const GroupBuffers& planned, const ZeroOptions& options, ParallelContext& parallel);
  void adopt_parameters(ZeroGroup& g, const std::vector<at::Tensor>& params, std::vector<at::Tensor>& shards, int rank,
                        bool release_gathered);
  void fill_bucket(ZeroGroup& g, int bucket, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& shards,
                   int rank);
  void add_segments(ZeroGroup& g, int64_t grad_numel, at::ScalarType gradient_dtype, int rank);
  void make_optimizer(ZeroGroup& g, const ZeroOptions& options, const ClientOptimizerFactory& client, int rank,
                      Communicator* tensor);

  // Gradients straight to the host: a bucket's reduced chunk (on the device) takes what the
  // window's earlier micro-steps left in the host copy, is scaled and normed on the boundary, and
  // goes to the host copy (zero/stage2.cpp calls it as each reduction completes).
  void reduced_to_host(ZeroGroup& g, int bucket, at::Tensor& reduced);
  void launch_gather(ZeroGroup& g, int bucket);
  void wait_oldest_gather();
  void remove_grad_hooks();

  struct Gather {
    int group, bucket;
    CommHandle handle;
  };
  std::unique_ptr<ZeroStage> stage_;
  bool overlap_allgather_;
  double allgather_wait_s_ = 0;
  std::deque<Gather> gathers_;         // launched, in order (a group's collectives finish in order)
  std::vector<std::vector<char>> gathering_;            // [group][bucket]: its allgather is in flight
  std::vector<std::vector<std::pair<int, int>>> unit_buckets_;  // [unit]: the (group, bucket)s it reads
  std::vector<std::pair<int, int>> gather_order_;  // every (group, bucket), in the next forward's order
  Communicator& data_;
  BufferPlan plan_;
  std::vector<std::unique_ptr<ZeroGroup>> groups_;
  std::vector<GradPart> grad_parts_;  // one per bucket chunk of every group, in launch_order_
  Reductions reductions_;
  UnitTracker* units_;
  bool ignore_unused_parameters_;
  std::vector<double> group_lrs_;  // set_group_learning_rates, by model group
  bool boundary_ = true;
  bool averaging_ = true;  // the optimizer wants this step's gradients averaged (optim/onebit.h)
  // Buckets are reduced in one fixed order on every rank (group by group, bucket by bucket, which
  // is the order backward fills them): a bucket waits for the ones before it, so a parameter that
  // one rank skips cannot reorder the collectives across ranks.
  std::vector<std::pair<int, int>> launch_order_;  // (group, bucket)
  size_t next_launch_ = 0;
  // Where the shards live (zero/residence.h). params_ outlives partitioned_, whose gathers read
  // from its files.
  std::unique_ptr<StepSite> site_;
  std::unique_ptr<StateSite> state_;
  std::unique_ptr<ParameterSite> params_;
  std::unique_ptr<PartitionedParameters> partitioned_;  // stage 3; destroyed before the groups
  int64_t delayed_update_after_ = -1;
  // Stages 2–3 with the host step (not with a client optimizer): no gradient shard on the device;
  // each reduced chunk accumulates in the StepSite's host copy (reduced_to_host).
  bool gradients_to_host_ = false;
  bool window_start_ = true;  // no micro-step of this accumulation window has reduced yet
  std::vector<std::vector<size_t>> launch_index_;  // [group][bucket]: its index in launch_order_ (grad_parts_)
  std::future<void> delayed_;  // the delayed step running (valid until finish_delayed_step)
  // super_offload (null without): last, so that its thread stops before what it steps goes.
  std::unique_ptr<SpeculativeStep> speculation_;
};

}  // namespace tessera
