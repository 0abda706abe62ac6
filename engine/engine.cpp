#include "engine/engine.h"

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <unordered_map>

#include "csrc/cpu_block_cache.h"
#include "csrc/device_stream.h"
#include "engine/flops_profiler.h"
#include "engine/heartbeat.h"
#include "engine/progress.h"
#include "engine/runnable.h"
#include "engine/zero_options.h"
#include "optim/grad_norm.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/parallel_context.h"
#include "zero/zero_optimizer.h"

namespace tessera {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every parameter's name, for the unit listing (zero/model.h's param_name, as ZeroOptimizer's errors).
std::unordered_map<const void*, std::string> parameter_names(const ModelDescription& model) {
  std::unordered_map<const void*, std::string> names;
  for (const ParamGroup& g : model.groups)
    for (size_t i = 0; i < g.params.size(); ++i)
      if (g.params[i].defined()) names.emplace(g.params[i].unsafeGetTensorImpl(), param_name(g, i));
  return names;
}

}  // namespace

// ---- units ---------------------------------------------------------------------------------------

UnitScope::UnitScope(UnitTracker* tracker, int unit) : tracker_(tracker), unit_(unit) { tracker_->forward_begin(unit); }

UnitScope::UnitScope(UnitScope&& other) noexcept : tracker_(other.tracker_), unit_(other.unit_) {
  other.tracker_ = nullptr;
}

UnitScope::~UnitScope() {
  if (tracker_) tracker_->forward_end(unit_);
}

void watch_unit_output(UnitTracker& tracker, int unit, const at::Tensor& output) {
  if (!output.requires_grad()) return;
  tracker.output_watched(unit);
  UnitTracker* t = &tracker;
  output.register_hook([t, unit](const at::Tensor& grad) {
    t->output_gradient(unit);
    return grad;
  });
}

at::Tensor UnitScope::output(const at::Tensor& output) {
  if (tracker_) watch_unit_output(*tracker_, unit_, output);
  return output;
}

// ---- construction --------------------------------------------------------------------------------

Engine::Engine(Config config, ParallelContext& parallel, ModelDescription model, EngineRole role)
    : config_(std::move(config)), parallel_(parallel), units_(model, parameter_names(model)) {
  if (!config_.gradient_accumulation_steps || !config_.train_micro_batch_size_per_gpu)
    throw std::invalid_argument("tessera: the config's batch sizes are not resolved; build it with load_config() "
                                "or resolve_config() for this world size");
  const GridShape& grid = parallel_.grid();
  if (grid.tensor != config_.tensor_parallel.tp_size || grid.pipe != config_.pipeline.stages ||
      grid.context != config_.context_parallel.size)
    throw std::invalid_argument("tessera: the parallel context (" + grid.str() +
                                ") does not match the config's tensor_parallel.tp_size, pipeline.stages and "
                                "context_parallel.size");
  RunContext run;
  run.grid = grid;
  run.device = parallel_.data().device();
  run.nccl = parallel_.backend() == BackendKind::Nccl;
  run.pipeline_stage = role == EngineRole::PipelineStage;
  run.host_staging = environment_.host_staging_on_cpu;
  for (const ParamGroup& g : model.groups) {
    for (const at::Tensor& p : g.params) run.parameters += p.defined() ? p.numel() : 0;
    for (const TensorSplit& split : g.tensor_splits) run.tensor_sliced = run.tensor_sliced || split.sharded();
  }
  const std::vector<std::string> notes = check_runnable(config_, run);  // engine/runnable.h
  if (parallel_.rank() == 0) {
    for (const std::string& note : notes) std::printf("[tessera] %s\n", note.c_str());
    std::fflush(stdout);
  }
  gradient_accumulation_steps_ = *config_.gradient_accumulation_steps;
  // A pipeline stage of v model chunks runs v backwards per micro-batch, one micro-step each; the
  // loss's 1/m scale is the PipelineEngine's (it passes its gradients to backward(outputs, ...)).
  if (role == EngineRole::PipelineStage) gradient_accumulation_steps_ *= config_.pipeline.virtual_stages;
  // CPU ranks: large blocks (the engine's buffers, ZeRO-3's gathers, activations) from mappings and
  // a bounded cache, so the resident set is the live bytes plus that bound (csrc/cpu_block_cache.h).
  if (parallel_.data().device().is_cpu()) CpuBlockCache::install_from_environment();
  if (config_.optimizer->client != static_cast<bool>(model.client_optimizer))
    throw std::invalid_argument(config_.optimizer->client
                                    ? "tessera: the config's optimizer is a client optimizer (" + config_.optimizer->type +
                                          ") but the model description brings none"
                                    : "tessera: the model description brings a client optimizer and the config has an "
                                      "optimizer section too");
  zero_ = std::make_unique<ZeroOptimizer>(zero_options_from_config(config_, parallel_.rank(), parallel_.replicas().size(), environment_), parallel_, model, &units_);
  // Groups reduced over communicators of their own add a world sum to the norm, on every rank or
  // none: the stages of a pipeline hold different groups, so they agree on it here.
  norm_over_world_ = zero_->has_groups_of_their_own();
  if (parallel_.pipe().size() > 1) {
    at::Tensor any = at::full({1}, norm_over_world_ ? 1.0 : 0.0, parallel_.world().options(at::kFloat));
    parallel_.world().all_reduce(any, ReduceOp::Max);
    norm_over_world_ = any.item<double>() > 0;
  }
  scaler_ = make_loss_scaler(config_.fp16, config_.bf16.enabled);
  schedule_ = config_.scheduler ? make_lr_schedule(config_.scheduler->type, config_.scheduler->params,
                                                   config_.optimizer->params.lr)
                                : make_lr_schedule("", {}, config_.optimizer->params.lr);
  progress_ = std::make_unique<ProgressMeter>(config_.steps_per_print, config_.wall_clock_breakdown,
                                              parallel_.rank() == 0, grid.data);
  heartbeat_ = std::make_unique<Heartbeat>();
  if (heartbeat_->restart_count() > 0 && parallel_.rank() == 0) {
    std::printf("[tessera] restart %d: %s\n", heartbeat_->restart_count(), heartbeat_->restart_reason().c_str());
    std::fflush(stdout);
  }
  if (config_.flops_profiler.enabled && parallel_.rank() == 0) {
    FlopsRunLayout layout{grid.world_size(), grid.data, grid.tensor, grid.pipe,
                          *config_.train_micro_batch_size_per_gpu * *config_.gradient_accumulation_steps,
                          parallel_.data().device()};
    flops_profiler_ = std::make_unique<UnitFlopsProfiler>(config_.flops_profiler, units_, run.parameters, layout);
    flops_profiler_->step_ended(0, progress_->totals());
  }
  if (parallel_.data().device().is_cpu()) {
    heap_trimmer_ = HeapTrimmer::from_environment();
    // The model's own tensors, now copied into the flat buffers, were glibc's: hand their pages
    // back before the first step counts them in its peak.
    if (heap_trimmer_->bound_bytes() >= 0) release_free_heap();
  }
  resumed_ = auto_resume();
  last_step_end_ = Clock::now();
}

Engine::~Engine() = default;

void Engine::disable_unit_flops_profiler() { flops_profiler_.reset(); }

// ---- backward ------------------------------------------------------------------------------------

bool Engine::is_gradient_accumulation_boundary() const {
  return (steps_.micro_step + 1) % gradient_accumulation_steps_ == 0;
}

void Engine::backward(const at::Tensor& loss) {
  last_loss_ = loss.detach().to(at::kDouble).reshape({1});
  // DeepSpeed's scaling: the loss of one micro-batch is 1/gas of the step's loss; fp16 scales up.
  run_backward([&] { (loss * (scaler_->scale() / double(gradient_accumulation_steps_))).backward(); });
  add_interval_loss(last_loss_.to(parallel_.data().device()));
}

void Engine::add_interval_loss(const at::Tensor& on_group) {
  interval_loss_sum_ = interval_loss_sum_.defined() ? interval_loss_sum_.add_(on_group) : on_group.clone();
  ++interval_losses_;
}

void Engine::backward(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& output_grads) {
  if (outputs.size() != output_grads.size())
    throw std::invalid_argument("tessera: backward(outputs, output_grads) got " + std::to_string(outputs.size()) +
                                " outputs and " + std::to_string(output_grads.size()) + " gradients");
  run_backward([&] { torch::autograd::backward(outputs, output_grads); });
}

void Engine::sum_tied_gradients(int group, Communicator& across, bool counted_here) {
  zero_->sum_group_gradients(group, across, counted_here);
}

void Engine::record_loss(double loss) {
  last_loss_ = at::full({1}, loss, parallel_.data().options(at::kDouble));
  add_interval_loss(last_loss_);
}

void Engine::run_backward(const std::function<void()>& autograd) {
  open_backward(BackwardKind::Engine);
  try {
    autograd();
  } catch (...) {
    abort_open_backward();
    throw;
  }
  close_backward();
}

void Engine::discard_unfinished_backward() {
  // A loss.backward() that raised inside autograd never reached its end: its window goes, as a
  // failed engine.backward(loss)'s does (the next forward or backward starts a fresh window).
  if (backward_open_) abort_open_backward();
}

void Engine::open_backward(BackwardKind kind) {
  discard_unfinished_backward();
  if (window_kind_ != BackwardKind::None && window_kind_ != kind)
    throw std::logic_error(
        "tessera: this gradient-accumulation window mixes engine.backward(loss) and loss.backward(): the first "
        "scales the loss by 1/gradient_accumulation_steps, the second leaves it whole for the step to divide; "
        "use one of them in every micro-step");
  window_kind_ = kind;
  zero_->wait_for_gathers();  // a unit the forward did not enter: its parameters are final now (a delayed step goes on)
  open_allgather_s_ = zero_->take_allgather_wait_s();
  open_forward_s_ = since(last_step_end_) - open_allgather_s_;
  backward_start_ = Clock::now();
  zero_->begin_backward(is_gradient_accumulation_boundary(), steps_.optimizer_step() + 1);
  // super_offload: the step as it will be unless clipping or an overflow intervenes (coefficient 1).
  if (zero_->speculates_steps()) zero_->speculate_step(1.0 / gradient_divisor(), next_step_inputs());
  backward_open_ = true;
  if (flops_profiler_) flops_profiler_->backward_began();
}

void Engine::abort_open_backward() {
  backward_open_ = false;
  if (flops_profiler_) flops_profiler_->backward_ended();
  // Buckets of this micro-step may be half filled or in flight: start the window again.
  zero_->abort_backward();
  restart_window();
}

void Engine::restart_window() {
  steps_.micro_step -= steps_.micro_step % gradient_accumulation_steps_;
  window_kind_ = BackwardKind::None;
}

void Engine::close_backward() {
  backward_open_ = false;
  if (flops_profiler_) flops_profiler_->backward_ended();
  StepTimes t;
  t.forward_s = open_forward_s_;
  t.allgather_s = open_allgather_s_;
  // ZeRO-3 waits for a unit's parameters inside autograd: counted as gather wait, not backward.
  const double gather_in_backward = zero_->take_allgather_wait_s();
  t.backward_s = since(backward_start_) - gather_in_backward;
  t.allgather_s += gather_in_backward;
  auto wait_start = Clock::now();
  try {
    zero_->end_backward();
  } catch (...) {  // it discarded the buckets (an unused parameter, a peer gone): the window starts again
    restart_window();
    throw;
  }
  t.reduce_s = since(wait_start);
  progress_->add_times(t);
  last_step_end_ = Clock::now();
  PartitionedParameters* partitioned = zero_->partitioned();
  if (partitioned && !partitioned->partitioned_mode() && !warned_no_units_ && parallel_.rank() == 0) {
    std::printf("[tessera] ZeRO-3: the model reported none of its units (Engine::unit in C++; the Python "
                "binding's module hooks), so its parameters stay whole on every rank\n");
    std::fflush(stdout);
  }
  warned_no_units_ = true;
}

void Engine::watch_model_output(const at::Tensor& output) {
  // Outputs the forward computed only: a leaf (a parameter or an input handed back) would keep a
  // hook per forward for as long as it lives.
  if (!output.requires_grad() || output.is_leaf()) return;
  std::weak_ptr<Engine*> alive = alive_;  // the output may outlive the engine
  output.register_hook([alive](const at::Tensor& grad) {
    if (auto engine = alive.lock()) (*engine)->begin_autograd_backward();
    return grad;
  });
}

void Engine::begin_autograd_backward() {
  // Outputs on several devices run their hooks on several autograd threads: one opens.
  std::lock_guard<std::mutex> lock(autograd_open_mutex_);
  // engine.backward(loss) runs this pass, or another output of the same pass came first (a pass
  // that failed before its end was dropped by the next forward, discard_unfinished_backward).
  if (backward_open_) return;
  if (config_.fp16.enabled)
    throw std::runtime_error(
        "tessera: loss.backward() with fp16 enabled: fp16 gradients need the loss multiplied by the loss scale "
        "before autograd, which engine.backward(loss) does; call engine.backward(loss) instead");
  open_backward(BackwardKind::Autograd);
  try {
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      if (backward_open_) close_backward();
    });
  } catch (...) {
    abort_open_backward();
    throw;
  }
}

const StepTimes& Engine::wall_clock_breakdown() const { return progress_->totals(); }

// Context-parallel ranks each see a part of the same samples' tokens: the job's tokens are this
// rank's times data × context, its samples this rank's times data (the meter multiplies by data).
void Engine::record_batch(int64_t samples, int64_t tokens) {
  progress_->add_samples(samples, tokens * parallel_.grid().context);
}

void Engine::record_moe(double aux_loss, int64_t routed, int64_t dropped) {
  moe_aux_sum_ += aux_loss;
  moe_routed_ += static_cast<double>(routed);
  moe_dropped_ += static_cast<double>(dropped);
  ++moe_records_;
}

// ---- step ----------------------------------------------------------------------------------------

void Engine::step() {
  if (backward_open_) {  // loss.backward()'s pass never reached its end: it threw inside autograd
    abort_open_backward();
    throw std::runtime_error("tessera: step() after a backward that did not finish (an exception inside autograd); "
                             "the gradients of this accumulation window were dropped, start it again");
  }
  ++steps_.micro_step;
  if (steps_.micro_step % gradient_accumulation_steps_ == 0) optimizer_step();
  last_step_end_ = Clock::now();
}

// One optimizer step, as the algorithm reads (DeepSpeed's order, one host read of the norm):
void Engine::optimizer_step() {
  auto start = Clock::now();
  // 1. Wait for the gradient reduction launched during backward.
  zero_->wait_for_gradients();

  // 2. Unscale, norm, overflow: the norm over every rank's part of the gradients, reduced over the
  //    right groups (optim/grad_norm.h); non-finite on any rank means overflow on every rank.
  // loss.backward() left each micro-batch's loss whole: the window's sum is divided here.
  const double scale = gradient_divisor();
  window_kind_ = BackwardKind::None;
  const NormGroups groups{&parallel_.replicas(), &parallel_.tensor(), &parallel_.pipe(),
                          norm_over_world_ ? &parallel_.world() : nullptr};
  const double sumsq = global_grad_sumsq(zero_->gradient_parts(), groups);
  const bool overflow = !std::isfinite(sumsq);

  if (!overflow) {
    // 3. Clip: unscaling and clipping are one factor on the gradients (DeepSpeed's rule).
    last_grad_norm_ = std::sqrt(sumsq) / scale;
    const double grad_scale = clip_coefficient(last_grad_norm_, config_.gradient_clipping) / scale;

    // 4. The optimizer on this rank's shards, at the schedule's lr (and OneCycle's momentum).
    zero_->apply(grad_scale, next_step_inputs());

    // 5. Parameter gather: every rank gets every updated chunk (stages 1–2), each bucket's
    //    allgather started as soon as it was updated. Waited for here, or, with overlap_comm and a
    //    model that reports its units, by the next forward unit by unit.
    zero_->gather_parameters(units_.model_reports_units());
  }

  // 6. Loss-scale update: one rule for every precision (optim/loss_scaler.h); an overflow skips
  //    the step and lowers a dynamic fp16 scale.
  const UpdateResult update = scaler_->update(overflow);
  if (update.skip_step) {
    ++steps_.skipped_steps;
    print_overflow(update);
  }

  // 7. Schedule: the next step's counters (the LR is a function of the applied steps), a fresh
  //    accumulation window, and the progress line when due.
  zero_->zero_grad();
  if (heap_trimmer_) heap_trimmer_->after_step();
  ++steps_.global_step;
  heartbeat_->beat();  // the launcher's hang detection: this rank made progress
  StepTimes t;
  t.allgather_s = zero_->take_allgather_wait_s();  // not overlapped: waited for in step 5
  t.optimizer_s = since(start) - t.allgather_s;
  t.optimizer_steps = 1;
  progress_->add_times(t);
  if (flops_profiler_) flops_profiler_->step_ended(steps_.global_step, progress_->totals());
  if (progress_->due(steps_.global_step)) print_progress();
  // checkpoint.save_interval: a checkpoint every so many steps, into checkpoint.save_dir.
  const CheckpointConfig& ckpt = config_.checkpoint;
  if (ckpt.save_interval > 0 && steps_.global_step % ckpt.save_interval == 0) {
    SaveOptions periodic;
    periodic.save_dir = ckpt.save_dir;
    save_checkpoint(periodic);
  }
}

SpeculativeStep::Counts Engine::speculation_counts() const { return zero_->speculation_counts(); }

double Engine::gradient_divisor() const {
  return scaler_->scale() * (window_kind_ == BackwardKind::Autograd ? double(gradient_accumulation_steps_) : 1.0);
}

StepInputs Engine::next_step_inputs() const {
  // The schedule advances on applied steps only (StepCounters).
  const int64_t at = steps_.schedule_step();
  StepInputs in;
  in.step = steps_.optimizer_step() + 1;
  in.lr = schedule_->lr_at(at);
  // OneCycle cycles the betas of optimizers that have them (Adam, AdamW, LAMB) and also sets
  // beta2, as DeepSpeed does; SGD has no betas, and DeepSpeed leaves its momentum alone.
  if (config_.optimizer->type != "SGD") {
    in.beta1 = schedule_->momentum_at(at);
    if (in.beta1) in.beta2 = kOneCycleBeta2;
  }
  return in;
}

void Engine::print_overflow(const UpdateResult& update) const {
  if (parallel_.rank() != 0) return;
  if (scaler_->dynamic() && update.new_scale != update.old_scale)
    std::printf("[tessera] step %lld: gradient overflow, step skipped; loss scale %g -> %g\n",
                (long long)steps_.global_step + 1, update.old_scale, update.new_scale);
  else if (scaler_->dynamic())
    std::printf("[tessera] step %lld: gradient overflow, step skipped; loss scale kept at %g (hysteresis)\n",
                (long long)steps_.global_step + 1, update.old_scale);
  else
    std::printf("[tessera] step %lld: non-finite gradients, step skipped\n", (long long)steps_.global_step + 1);
  std::fflush(stdout);
}

// All ranks join the average of the interval's loss; rank 0 prints. The one host read of the
// losses happens here, every steps_per_print steps.
void Engine::print_progress() {
  // No loss recorded (the script's loss.backward(): the engine never saw it) prints "n/a"; every
  // rank of the data group trains the same way, so the count decides alike everywhere.
  const bool loss_known = interval_losses_ > 0;
  at::Tensor mean = loss_known ? interval_loss_sum_ / double(interval_losses_)
                               : at::zeros({1}, parallel_.data().options(at::kDouble));
  if (parallel_.data().size() > 1) parallel_.data().all_reduce(mean, ReduceOp::Avg);
  interval_loss_sum_ = at::Tensor();
  interval_losses_ = 0;
  std::string extra;
  if (moe_records_ > 0) {  // the MoE layers' auxiliary loss and share of choices dropped, over the data group
    at::Tensor moe = at::tensor({moe_aux_sum_ / double(moe_records_), moe_routed_, moe_dropped_}, at::kDouble)
                         .to(parallel_.data().device());
    if (parallel_.data().size() > 1) parallel_.data().all_reduce(moe, ReduceOp::Avg);
    moe = moe.cpu();
    const double routed = moe[1].item<double>();
    char buf[96];
    std::snprintf(buf, sizeof(buf), " | moe aux %.4f | dropped %.2f%%", moe[0].item<double>(),
                  routed > 0 ? 100.0 * moe[2].item<double>() / routed : 0.0);
    extra += buf;
    moe_aux_sum_ = moe_routed_ = moe_dropped_ = 0;
    moe_records_ = 0;
  }
  // The 1-bit family: the phase of the last step and what this rank sent per step on the data group.
  const std::string phase = zero_->optimizer_phase();
  if (!phase.empty()) {
    int64_t sent = 0;
    for (const auto& [name, stats] : parallel_.data().stats()) sent += stats.sent_bytes;
    const int64_t steps = steps_.global_step - steps_at_last_print_;
    char buf[128];
    std::snprintf(buf, sizeof(buf), " | %s | sent %.1f KB/step", phase.c_str(),
                  steps > 0 ? double(sent - sent_at_last_print_) / steps / 1e3 : 0.0);
    extra += buf;
    sent_at_last_print_ = sent;
  }
  steps_at_last_print_ = steps_.global_step;
  if (heartbeat_->restart_count() > 0) extra += " | restart " + std::to_string(heartbeat_->restart_count());
  std::string line = progress_->line(steps_.global_step, loss_known ? std::optional<double>(mean.item<double>()) : std::nullopt,
                                     learning_rate(), scaler_->scale(),
                                     last_grad_norm_, extra);
  if (progress_->printer()) {
    std::printf("%s\n", line.c_str());
    if (config_.memory_breakdown)
      std::printf("%s\n", memory_line(memory(), peak_rss_bytes(), parallel_.device(), device_memory(parallel_.device())).c_str());
    std::fflush(stdout);
  }
}

double Engine::learning_rate() const {
  const std::vector<double>& client = zero_->group_learning_rates();
  return client.empty() ? schedule_->lr_at(steps_.schedule_step()) : client.front();
}

void Engine::set_group_learning_rates(std::vector<double> lrs) { zero_->set_group_learning_rates(std::move(lrs)); }

double Engine::loss_scale() const { return scaler_->scale(); }

double Engine::last_loss() const { return last_loss_.defined() ? last_loss_.item<double>() : 0.0; }

void Engine::zero_grad() { zero_->zero_grad(); }

void Engine::wait_for_parameters() { zero_->wait_for_parameters(); }

void Engine::gather_all_parameters() {
  zero_->wait_for_parameters();
  if (PartitionedParameters* p = zero_->partitioned()) p->gather_all();
}

void Engine::partition_without_units() {
  zero_->wait_for_parameters();
  if (PartitionedParameters* p = zero_->partitioned()) p->partition_without_units();
}

void Engine::release_all_parameters() {
  if (PartitionedParameters* p = zero_->partitioned()) p->release_all();
}

void Engine::write_back_parameters(int root) { zero_->write_back_parameters(root); }

void Engine::fetch_parameter(const at::Tensor& param) {
  if (PartitionedParameters* p = zero_->partitioned()) p->fetch(param);
}

void Engine::end_of_forward() {
  if (PartitionedParameters* p = zero_->partitioned()) p->end_of_forward();
}

Engine::GatheredScope::GatheredScope(Engine* engine) : engine_(engine) { engine_->gather_all_parameters(); }

Engine::GatheredScope::~GatheredScope() {
  if (engine_) engine_->release_all_parameters();
}

bool Engine::parameters_in_flight() const { return zero_->parameters_in_flight(); }

std::string Engine::optimizer_phase() const { return zero_->optimizer_phase(); }

std::vector<std::pair<std::string, at::Tensor>> Engine::optimizer_state() const { return zero_->optimizer_state(); }

MemoryReport Engine::memory() const { return zero_->memory(); }

std::vector<Engine::GroupMemory> Engine::group_memory() const {
  std::vector<GroupMemory> out;
  for (const auto& g : zero_->groups())
    out.push_back({g->names.empty() ? "" : g->names.front(), g->comm_name, g->comm->size(), g->layout.total,
                   g->layout.shard_numel, g->optimizer ? g->optimizer->state_bytes() : 0});
  return out;
}

// ---- checkpoints ---------------------------------------------------------------------------------

TrainingState Engine::training_state() {
  return {*zero_, *scaler_, parallel_, config_, steps_, schedule_->name()};
}

std::string Engine::save_checkpoint(const SaveOptions& options) {
  wait_for_checkpoint();  // one save at a time, committed in order
  TrainingState state = training_state();
  SaveOptions o = options;
  o.async = o.async || config_.checkpoint.async_save;
  // Read at each save, not with the rest at construction: a test sets it just before the save it kills.
  const EngineEnvironment environment = EngineEnvironment::read();
  if (o.crash_at.empty()) o.crash_at = environment.checkpoint_crash_at;
  if (o.write_delay_ms == 0) o.write_delay_ms = environment.checkpoint_write_delay_ms;
  SaveResult saved = tessera::save_checkpoint(state, o);
  pending_save_ = std::move(saved.pending);
  return saved.path;
}

void Engine::wait_for_checkpoint() {
  if (!pending_save_) return;
  std::unique_ptr<BackgroundSave> pending = std::move(pending_save_);
  pending->wait();
}

int64_t Engine::checkpoint_host_bytes() const { return pending_save_ ? pending_save_->host_bytes() : 0; }
bool Engine::checkpoint_in_flight() const { return pending_save_ && !pending_save_->done(); }

LoadResult Engine::load_checkpoint(LoadOptions options) {
  wait_for_checkpoint();
  options.load_from_fp32_weights = config_.zero_optimization.load_from_fp32_weights;
  TrainingState state = training_state();
  LoadResult result = tessera::load_checkpoint(state, options);
  steps_at_last_print_ = steps_.global_step;  // the progress line's per-step figures start here
  last_step_end_ = Clock::now();
  return result;
}

std::string Engine::save_16bit_model(const std::string& save_dir, const std::string& save_filename) {
  GatheredScope whole(this);  // ZeRO-3: every parameter whole for the while
  TrainingState state = training_state();
  return tessera::save_16bit_model(state, save_dir, save_filename);
}

}  // namespace tessera
