// Engine: the composition root. Built from a Config, a ParallelContext and a model description
// (its parameters in optimizer groups, and its units: zero/model.h), it owns the ZeRO buffers and
// stage strategy, the loss scaler, the LR schedule and the unit tracker, and drives one training
// step in DeepSpeed's shape:
//
//   for each micro-batch:  loss = model(batch);  engine.backward(loss);  engine.step();
//
// `step()` applies the optimizer only at a gradient-accumulation boundary (every
// gradient_accumulation_steps micro-steps), as DeepSpeed's engine does; engine.cpp reads the step
// top-down. The engine never sees the model's code: C++ and Python models hand it the same
// parameter lists, and say where each unit's forward starts and ends (unit()).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/heap_trim.h"
#include "engine/checkpoint/engine_checkpoint.h"
#include "engine/config/config.h"
#include "engine/environment.h"
#include "zero/model.h"
#include "zero/speculative_step.h"
#include "zero/units.h"

namespace tessera {

class Communicator;
class ParallelContext;
class ZeroOptimizer;
class LossScaler;
class LrSchedule;
class ProgressMeter;
class UnitFlopsProfiler;
class Heartbeat;
struct StepTimes;
struct UpdateResult;

// The forward of one unit, from construction to destruction (RAII), as a C++ model reports it:
//
//   at::Tensor Block::forward(at::Tensor x) {
//     auto scope = engine.unit(i);
//     ...
//     return scope.output(y);   // optional: the unit's backward begins when y's gradient arrives
//   }
// Reports unit `unit`'s backward begin when `output`'s gradient arrives (a hook on the tensor).
void watch_unit_output(UnitTracker& tracker, int unit, const at::Tensor& output);

class UnitScope {
 public:
  UnitScope(UnitTracker* tracker, int unit);
  ~UnitScope();
  UnitScope(UnitScope&& other) noexcept;
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;
  UnitScope& operator=(UnitScope&&) = delete;
  // Returns `output` unchanged, with a hook that reports the unit's backward begin.
  at::Tensor output(const at::Tensor& output);

 private:
  UnitTracker* tracker_;
  int unit_;
};

// What an Engine trains: a whole model (the default; pipeline.stages must be 1), or one stage of a
// model cut for pipeline parallelism, driven by PipelineEngine (engine/pipeline_engine.h).
enum class EngineRole { WholeModel, PipelineStage };

class Engine {
 public:
  Engine(Config config, ParallelContext& parallel, ModelDescription model, EngineRole role = EngineRole::WholeModel);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Scales the loss (1/gradient_accumulation_steps, and the fp16 loss scale) and runs autograd;
  // gradients are folded into the engine's fp32 buffers and reduced in buckets as they arrive.
  // If autograd throws (a caught KeyboardInterrupt, out of memory), the gradients accumulated since
  // the last optimizer step are discarded and the accumulation window starts again; the exception
  // is rethrown. No host synchronization: the loss is read only when a progress line is due.
  void backward(const at::Tensor& loss);
  // The backward of a model part whose outputs feed something else (a pipeline stage): autograd
  // from `outputs` with `output_grads` as their gradients, which are used as given (they come from
  // the part that owns the loss, already scaled by it). Records no loss.
  void backward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& output_grads);
  // A backward whose autograd pass the caller runs (a pipeline stage's split backward: the weights'
  // pass of a zero-bubble schedule), counted and reduced as backward(outputs, output_grads) is.
  void run_backward(const std::function<void()>& autograd);
  // PyTorch-style `loss.backward()` followed by step(): call with each output of the model's
  // forward that requires grad. When autograd reaches one without backward() having begun, the
  // engine's backward begins there and ends with autograd's pass. Such a backward leaves the loss
  // unscaled: its window's gradients are the micro-batches' sum, and the step divides by
  // gradient_accumulation_steps in its unscale factor (no extra pass over the gradients). Refused
  // under fp16 (the loss must be scaled: backward(loss) does it); one window is all one kind.
  void watch_model_output(const at::Tensor& output);
  // The Python forward calls it first: a loss.backward() that raised inside autograd left its
  // backward open; that window is dropped, as a failed backward(loss)'s is.
  void discard_unfinished_backward();
  // A pipeline stage (PipelineEngine): after the boundary backward, param group `group`'s gradients
  // summed over `across`, the stages holding the same tied weights (ZeroOptimizer::sum_group_gradients).
  void sum_tied_gradients(int group, Communicator& across, bool counted_here);
  // A pipeline stage: the batch's loss, computed on the last stage, for the progress line (the
  // stages without a loss would print 0).
  void record_loss(double loss);
  // At a boundary: the optimizer step (engine.cpp reads it top-down). Otherwise counts the micro-step.
  void step();
  bool is_gradient_accumulation_boundary() const;
  void zero_grad();

  // With zero_optimization.overlap_comm at stages 1–2 and a model that reports its units, step()
  // leaves the allgather of the updated parameters in flight: each unit's forward waits for its
  // own. Anything else that reads the parameters (evaluation without units, saving them, the end
  // of training) calls this first; the engine's destructor and backward() call it too.
  void wait_for_parameters();
  bool parameters_in_flight() const;

  // ZeRO-3: a partitioned parameter holds data only while its unit runs. To read them elsewhere
  // (evaluation without units, saving, comparing), gather every one for a while (DeepSpeed's
  // zero.GatheredParameters over all of them); scopes nest. At other stages this does nothing.
  //   { auto whole = engine.gathered_parameters(); ... read model parameters ... }
  class GatheredScope {
   public:
    explicit GatheredScope(Engine* engine);
    ~GatheredScope();
    GatheredScope(GatheredScope&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
    GatheredScope(const GatheredScope&) = delete;
    GatheredScope& operator=(const GatheredScope&) = delete;
    GatheredScope& operator=(GatheredScope&&) = delete;

   private:
    Engine* engine_;
  };
  GatheredScope gathered_parameters() { return GatheredScope(this); }
  void gather_all_parameters();   // what the scope does; pair each with release_all_parameters()
  // ZeRO-3 for a model that reports no units and gathers its parameters itself (a pipeline stage:
  // gathered_parameters() around its batch or each forward and backward): partitioned from now on,
  // whole only inside such scopes. At other stages this does nothing.
  void partition_without_units();
  void release_all_parameters();
  // After the model's parameters were modified on data-parallel rank `root` (inside
  // gathered_parameters() at ZeRO-3): every rank's buffers, shards and master copy take its values.
  void write_back_parameters(int root);
  // ZeRO-3: a partitioned parameter read outside the units that list it (zero/partitioned_parameters.h).
  void fetch_parameter(const at::Tensor& param);
  // ZeRO-3: the model's forward ended (the Python binding calls it); without grad, nothing stays gathered.
  void end_of_forward();

  // The model's units (zero/model.h): a C++ model enters each unit's scope in its forward.
  UnitScope unit(int index) { return UnitScope(&units_, index); }
  UnitTracker& units() { return units_; }

  // flops_profiler counts a C++ model's ATen ops through its units (engine/flops_profiler.h); the
  // Python binding profiles modules through their hooks instead (tessera/flops_profiler.py) and
  // turns this one off.
  void disable_unit_flops_profiler();

  // Tells the progress line how many samples (and tokens) the last micro-batch had on this rank.
  void record_batch(int64_t samples, int64_t tokens = 0);
  // Tells the progress line what the last micro-batch's MoE layers did on this rank: their
  // load-balancing losses l_aux (summed over the layers, before the script's coefficient) and how
  // many expert choices they routed and dropped.
  // The line then shows the interval's mean auxiliary loss and the share dropped, over the data
  // group ("moe aux 0.0123 | dropped 1.2%"). Every data-parallel rank records alike, or none does.
  void record_moe(double aux_loss, int64_t routed, int64_t dropped);

  int64_t global_step() const { return steps_.global_step; }
  int64_t micro_step() const { return steps_.micro_step; }
  int64_t skipped_steps() const { return steps_.skipped_steps; }
  double learning_rate() const;
  // A client LR scheduler (Python's torch.optim.lr_scheduler) sets each model group's learning
  // rate (ModelDescription::groups) for the steps that follow, instead of the config's schedule
  // times the group's factor; empty: the config's schedule again.
  void set_group_learning_rates(std::vector<double> lrs);
  double loss_scale() const;
  double last_grad_norm() const { return last_grad_norm_; }
  // Seconds spent in each part of the step since construction, summed (engine/progress.h).
  const StepTimes& wall_clock_breakdown() const;
  double last_loss() const;  // this rank's last micro-batch loss (reads it from the device)
  const Config& config() const { return config_; }
  ParallelContext& parallel() { return parallel_; }
  MemoryReport memory() const;
  // offload_optimizer.super_offload: the speculated steps kept and restored so far, and the chunks
  // stepped during backward (zero/speculative_step.h); zeros without it.
  SpeculativeStep::Counts speculation_counts() const;
  // Each ZeRO group's layout on this rank: which communicator it is reduced and partitioned over,
  // its elements and this rank's shard of them, and the optimizer state this rank holds for it
  // (an MoE model's expert groups against its dense ones, for benchmarks and tests).
  struct GroupMemory {
    std::string first_parameter, communicator;
    int ranks = 1;
    int64_t numel = 0, shard_numel = 0, state_bytes = 0;
  };
  std::vector<GroupMemory> group_memory() const;
  // The optimizer's phase ("warm-up", "compressed", "local": the 1-bit family; empty otherwise).
  std::string optimizer_phase() const;
  // The optimizer's state by name, "group.name" (exp_avg, exp_avg_sq, the 1-bit family's error
  // buffers...), as tensors the optimizer updates in place: what a checkpoint saves and restores.
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;

  // Checkpoints (engine/checkpoint/engine_checkpoint.h, DeepSpeed's calls): every rank calls them.
  // save_checkpoint returns the checkpoint's directory; load_checkpoint its directory and the
  // client_state saved with it (JSON text). options.load_from_fp32_weights comes from the config.
  // With checkpoint.async_save (or options.async) the save returns once this rank's state is copied
  // to host memory; the next save, a load, wait_for_checkpoint() and the engine's end wait for it
  // and raise its error, on every rank.
  std::string save_checkpoint(const SaveOptions& options);
  LoadResult load_checkpoint(LoadOptions options);
  // checkpoint.auto_resume: what the engine loaded at its construction (the latest checkpoint of
  // checkpoint.load_dir, else save_dir); nullopt when it loaded nothing.
  const std::optional<LoadResult>& resumed() const { return resumed_; }
  void wait_for_checkpoint();
  // The asynchronous save not yet waited for, if any: its snapshot's bytes on this rank (0: none),
  // and whether its thread is still writing.
  int64_t checkpoint_host_bytes() const;
  bool checkpoint_in_flight() const;
  // The model's weights in its own dtype, whole, in one safetensors file written by rank 0
  // (DeepSpeed's save_16bit_model; ZeRO-3 gathers them first). Returns the file's path.
  std::string save_16bit_model(const std::string& save_dir, const std::string& save_filename = "model.safetensors");

 private:
  // Who began the micro-steps of the current accumulation window (they may not mix).
  enum class BackwardKind { None, Engine, Autograd };
  void open_backward(BackwardKind kind);  // before autograd runs
  void close_backward();                  // after it
  void abort_open_backward();             // autograd threw: the window starts again
  void restart_window();                  // the micro-step count back to the window's start
  void begin_autograd_backward();         // a watched output's gradient arrived
  void add_interval_loss(const at::Tensor& on_group);  // a loss for the next progress line's mean
  void optimizer_step();
  // What the loss carries into this window's gradients and the step divides out: the loss scale,
  // times the accumulation steps when loss.backward() left each micro-batch's loss whole.
  double gradient_divisor() const;
  // The coming optimizer step's inputs but the gradient scale (the schedule's lr and momentum).
  StepInputs next_step_inputs() const;
  void print_overflow(const UpdateResult& update) const;
  void print_progress();
  TrainingState training_state();
  std::optional<LoadResult> auto_resume();

  Config config_;
  ParallelContext& parallel_;
  UnitTracker units_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<ProgressMeter> progress_;
  std::unique_ptr<UnitFlopsProfiler> flops_profiler_;  // flops_profiler.enabled, on global rank 0
  std::optional<LoadResult> resumed_;     // checkpoint.auto_resume's load
  std::unique_ptr<Heartbeat> heartbeat_;  // the launcher's hang detection and restart count (engine/heartbeat.h)
  std::optional<HeapTrimmer> heap_trimmer_;  // CPU ranks, TESSERA_HEAP_TRIM_MIB: bounds the heap's creep (csrc/heap_trim.h)
  int64_t gradient_accumulation_steps_ = 1;
  StepCounters steps_;
  double last_grad_norm_ = 0;
  at::Tensor last_loss_;          // the last micro-batch's loss, on its device
  at::Tensor interval_loss_sum_;  // losses since the last progress line, on the data group's device
  int64_t interval_losses_ = 0;
  int64_t steps_at_last_print_ = 0, sent_at_last_print_ = 0;  // the progress line's bytes per step
  double moe_aux_sum_ = 0, moe_routed_ = 0, moe_dropped_ = 0;  // record_moe since the last progress line
  int64_t moe_records_ = 0;
  bool warned_no_units_ = false;
  bool norm_over_world_ = false;  // some rank's ZeRO groups are on communicators of their own
  EngineEnvironment environment_ = EngineEnvironment::read();  // engine/environment.h: read once
  std::chrono::steady_clock::time_point last_step_end_;
  bool backward_open_ = false;
  BackwardKind window_kind_ = BackwardKind::None;
  double open_forward_s_ = 0, open_allgather_s_ = 0;  // the backward in progress: its forward's times
  std::mutex autograd_open_mutex_;
  std::shared_ptr<Engine*> alive_ = std::make_shared<Engine*>(this);  // hooks on outputs hold it weakly
  std::chrono::steady_clock::time_point backward_start_;
  // checkpoint.async_save: the save being written (declared last: its thread ends first).
  std::unique_ptr<BackgroundSave> pending_save_;
};

}  // namespace tessera
