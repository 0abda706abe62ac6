#include "engine/pipeline_engine.h"

#include <map>
#include <optional>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/parallel_context.h"
#include "parallel/pipeline/schedule.h"

namespace tessera {

using pipeline::BatchReport;
using pipeline::PipelineExecutor;

at::Tensor PipelineStageModel::forward(int chunk, const at::Tensor& input) {
  if (chunk != 0)
    throw std::invalid_argument("PipelineEngine: this stage model holds one chunk; pipeline.virtual_stages asks for chunk " +
                                std::to_string(chunk) + " (override PipelineStageModel::forward(chunk, input))");
  return forward(input);
}

// The executor's view of this rank's stage: loads from the caller's iterator, the model's forward
// and loss, and the Engine's backward and step.
class PipelineEngine::Stage final : public pipeline::PipelineStage {
 public:
  Stage(PipelineEngine& owner, const MicroBatchSource& data) : owner_(owner), data_(data) {}

  void load(int micro_batch) override {
    MicroBatch batch = data_();
    if (owner_.stage() == 0) inputs_[micro_batch] = batch.inputs;
    if (owner_.stage() == owner_.last_stage()) labels_[micro_batch] = batch.labels;
  }

  at::Tensor forward(int micro_batch, const at::Tensor& input) override { return forward(micro_batch, 0, input); }

  at::Tensor forward(int micro_batch, int chunk, const at::Tensor& input) override {
    at::Tensor out = owner_.model_.forward(chunk, first(chunk) ? take(inputs_, micro_batch) : input);
    if (at::Tensor aux = owner_.model_.take_auxiliary_loss(); aux.defined()) auxiliary_[{micro_batch, chunk}] = aux;
    return last(chunk) ? owner_.model_.loss(out, take(labels_, micro_batch)) : out;
  }

  BackwardRoots backward_roots(int micro_batch, int chunk, const at::Tensor& output, const at::Tensor& grad) override {
    // The last stage scales its loss as Engine::backward(loss) does (1/m, and the fp16 scale);
    // the others back-propagate the gradient they received, scaled already. A chunk's auxiliary
    // loss goes back with its output at the loss's scale.
    const double loss_scale = owner_.engine_->loss_scale() / double(owner_.executor_->schedule().micro_batches);
    BackwardRoots roots{{output}, {last(chunk) ? at::full_like(output, loss_scale) : grad}};
    if (auto it = auxiliary_.find({micro_batch, chunk}); it != auxiliary_.end()) {
      roots.outputs.push_back(it->second);
      roots.grads.push_back(at::full_like(it->second, loss_scale));
      auxiliary_.erase(it);
    }
    return roots;
  }

  void weight_pass(int, int chunk, const std::function<void()>& pass) override {
    Engine& engine = *owner_.engine_;
    engine.run_backward(pass);
    if (chunk == 0) engine.record_batch(owner_.micro_batch_size_);
    // Engine::step() counts micro-steps (one per chunk's backward); the last one (the optimizer's)
    // waits for OptimizerStep, after the tied weights' gradients are summed.
    const auto& schedule = owner_.executor_->schedule();
    if (++backwards_ < schedule.micro_batches * schedule.chunks) engine.step();
  }

  // ZeRO-3 with pipeline.zero3_gather "micro_batch": the stage's parameters whole only while an
  // instruction computes (autograd's saved views see them gathered again for the backward).
  void compute(const std::function<void()>& work) override {
    if (!owner_.gather_per_instruction_) return work();
    Engine::GatheredScope whole = owner_.engine_->gathered_parameters();
    work();
  }

  void reduce_tied_grads() override {
    for (const TiedGroup& t : owner_.tied_)
      owner_.engine_->sum_tied_gradients(t.param_group, owner_.parallel_.pipe_stages(t.stages),
                                         /*counted_here=*/t.stages.front() == owner_.stage());
  }

  void step() override {}  // PipelineEngine::train_batch steps once the batch's loss is known

 private:
  // The model's first and last chunks (interleaved schedules: stage 0's chunk 0, the last stage's
  // v − 1; V: stage 0's chunks 0 and 1).
  bool first(int chunk) const { return owner_.schedule().layout().first(owner_.stage(), chunk); }
  bool last(int chunk) const { return owner_.schedule().layout().last(owner_.stage(), chunk); }
  static at::Tensor take(std::map<int, at::Tensor>& by_micro_batch, int micro_batch) {
    auto it = by_micro_batch.find(micro_batch);
    if (it == by_micro_batch.end())
      throw std::logic_error("PipelineEngine: micro-batch " + std::to_string(micro_batch) + " was not loaded");
    at::Tensor t = std::move(it->second);
    by_micro_batch.erase(it);
    return t;
  }
  std::map<std::pair<int, int>, at::Tensor> auxiliary_;  // per (micro-batch, chunk) in flight: its auxiliary loss
  PipelineEngine& owner_;
  const MicroBatchSource& data_;
  std::map<int, at::Tensor> inputs_, labels_;  // loaded, until the first / last chunk's forward reads them
  int backwards_ = 0;
};

PipelineEngine::PipelineEngine(Config config, ParallelContext& parallel, PipelineStageModel& model,
                               ModelDescription stage_params, std::vector<TiedGroup> tied)
    : parallel_(parallel), model_(model), tied_(std::move(tied)) {
  const int stages = parallel.pipe().size();
  const int64_t m = config.gradient_accumulation_steps.value_or(1);
  micro_batch_size_ = config.train_micro_batch_size_per_gpu.value_or(1);
  for (const TiedGroup& t : tied_) {
    if (t.param_group < 0 || t.param_group >= static_cast<int>(stage_params.groups.size()))
      throw std::invalid_argument("PipelineEngine: tied group " + std::to_string(t.param_group) + " is not one of this stage's " +
                                  std::to_string(stage_params.groups.size()) + " parameter groups");
    if (std::find(t.stages.begin(), t.stages.end(), stage()) == t.stages.end())
      throw std::invalid_argument("PipelineEngine: a tied group lists stages without this one (" + std::to_string(stage()) + ")");
  }
  auto schedule = pipeline::make_schedule(config.pipeline.schedule, stages, static_cast<int>(m), config.pipeline.virtual_stages);
  if (config.pipeline.activation_checkpoint_interval > 0 && schedule.split_backward)
    throw std::invalid_argument("pipeline.activation_checkpoint_interval " +
                                std::to_string(config.pipeline.activation_checkpoint_interval) + " with pipeline.schedule \"" +
                                schedule.name + "\": a recomputed segment computes its weights' gradients with its input's, "
                                "which a zero-bubble schedule splits; use \"1f1b\" or \"interleaved_1f1b\"");
  const bool dynamic_shape = config.pipeline.dynamic_shape;
  const bool zero3 = config.zero_optimization.stage == 3;
  gather_per_instruction_ = zero3 && config.pipeline.zero3_gather == "micro_batch";
  gather_per_batch_ = zero3 && !gather_per_instruction_;
  engine_ = std::make_unique<Engine>(std::move(config), parallel, std::move(stage_params), EngineRole::PipelineStage);
  // ZeRO-3: the stage reports no units; it gathers its partitioned parameters itself, around the
  // batch or each forward and backward (pipeline.zero3_gather).
  if (zero3) engine_->partition_without_units();
  executor_ = std::make_unique<PipelineExecutor>(parallel.pipe(), std::move(schedule), dynamic_shape);
}

PipelineEngine::~PipelineEngine() = default;

int PipelineEngine::stage() const { return parallel_.pipe().rank(); }
int PipelineEngine::stages() const { return parallel_.pipe().size(); }
int PipelineEngine::last_stage() const { return schedule().layout().last_stage(); }

double PipelineEngine::mean_loss(const std::vector<double>& losses) {
  // The loss's stage (the last; stage 0 with the V placement) has the losses; its data group
  // averages them; it tells the other stages.
  at::Tensor mean = at::zeros({1}, parallel_.data().options(at::kDouble));
  if (stage() == last_stage()) {
    double sum = 0;
    for (double l : losses) sum += l;
    mean.fill_(losses.empty() ? 0.0 : sum / double(losses.size()));
    if (parallel_.data().size() > 1) parallel_.data().all_reduce(mean, ReduceOp::Avg);
  }
  if (stages() > 1) parallel_.pipe().broadcast(mean, last_stage());
  return mean.item<double>();
}

BatchReport PipelineEngine::run_batch(PipelineExecutor& executor, pipeline::PipelineStage& stage) {
  // ZeRO-3 gathered once per batch (the default): whole while the stage runs its micro-batches.
  std::optional<Engine::GatheredScope> whole;
  if (gather_per_batch_) whole.emplace(engine_->gathered_parameters());
  return executor.run(stage);
}

double PipelineEngine::train_batch(const MicroBatchSource& data) {
  Stage stage(*this, data);
  report_ = run_batch(*executor_, stage);
  const double loss = mean_loss(report_.losses);
  engine_->record_loss(loss);
  engine_->step();  // the boundary: the optimizer step (and the progress line when due)
  return loss;
}

double PipelineEngine::eval_batch(const MicroBatchSource& data) {
  at::NoGradGuard no_grad;
  if (!eval_executor_)
    eval_executor_ = std::make_unique<PipelineExecutor>(
        parallel_.pipe(),
        pipeline::forward_only(stages(), schedule().micro_batches, schedule().chunks, schedule().placement),
        engine_->config().pipeline.dynamic_shape);
  Stage stage(*this, data);
  engine_->wait_for_parameters();
  BatchReport report = run_batch(*eval_executor_, stage);
  return mean_loss(report.losses);
}

}  // namespace tessera
