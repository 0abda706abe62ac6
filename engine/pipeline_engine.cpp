#include "engine/pipeline_engine.h"

#include <map>

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

// The executor's view of this rank's stage: loads from the caller's iterator, the model's forward
// and loss, and the Engine's backward and step.
class PipelineEngine::Stage final : public pipeline::PipelineStage {
 public:
  Stage(PipelineEngine& owner, const MicroBatchSource& data) : owner_(owner), data_(data) {}

  void load(int) override {
    MicroBatch batch = data_();
    if (first()) input_ = batch.inputs;
    if (last()) labels_ = batch.labels;
  }

  at::Tensor forward(int micro_batch, const at::Tensor& input) override {
    at::Tensor out = owner_.model_.forward(first() ? input_ : input);
    if (at::Tensor aux = owner_.model_.take_auxiliary_loss(); aux.defined()) auxiliary_[micro_batch] = aux;
    return last() ? owner_.model_.loss(out, labels_) : out;
  }

  void backward(int micro_batch, const at::Tensor& output, const at::Tensor& grad) override {
    Engine& engine = *owner_.engine_;
    const int m = owner_.executor_->schedule().micro_batches;
    // The last stage scales its loss as Engine::backward(loss) does (1/m, and the fp16 scale);
    // the others back-propagate the gradient they received, scaled already. A stage's auxiliary
    // loss goes back with its output at the loss's scale.
    const double loss_scale = engine.loss_scale() / double(m);
    std::vector<at::Tensor> outputs{output};
    std::vector<at::Tensor> grads{last() ? at::full_like(output, loss_scale) : grad};
    if (auto it = auxiliary_.find(micro_batch); it != auxiliary_.end()) {
      outputs.push_back(it->second);
      grads.push_back(at::full_like(it->second, loss_scale));
      auxiliary_.erase(it);
    }
    engine.backward(outputs, grads);
    engine.record_batch(owner_.micro_batch_size_);
    // Engine::step() counts micro-steps; the last one (the optimizer's) waits for OptimizerStep,
    // after the tied weights' gradients are summed.
    if (++backwards_ < m) engine.step();
  }

  void reduce_tied_grads() override {
    for (const TiedGroup& t : owner_.tied_)
      owner_.engine_->sum_tied_gradients(t.param_group, owner_.parallel_.pipe_stages(t.stages),
                                         /*counted_here=*/t.stages.front() == owner_.stage());
  }

  void step() override {}  // PipelineEngine::train_batch steps once the batch's loss is known

 private:
  bool first() const { return owner_.stage() == 0; }
  bool last() const { return owner_.stage() == owner_.stages() - 1; }
  std::map<int, at::Tensor> auxiliary_;  // per micro-batch in flight: its auxiliary loss
  PipelineEngine& owner_;
  const MicroBatchSource& data_;
  at::Tensor input_, labels_;
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
  auto schedule = pipeline::make_schedule(config.pipeline.schedule, stages, static_cast<int>(m));
  const bool dynamic_shape = config.pipeline.dynamic_shape;
  engine_ = std::make_unique<Engine>(std::move(config), parallel, std::move(stage_params), EngineRole::PipelineStage);
  executor_ = std::make_unique<PipelineExecutor>(parallel.pipe(), std::move(schedule), dynamic_shape);
}

PipelineEngine::~PipelineEngine() = default;

int PipelineEngine::stage() const { return parallel_.pipe().rank(); }
int PipelineEngine::stages() const { return parallel_.pipe().size(); }

double PipelineEngine::mean_loss(const std::vector<double>& losses) {
  // The last stage has the losses; its data group averages them; it tells the other stages.
  at::Tensor mean = at::zeros({1}, parallel_.data().options(at::kDouble));
  if (stage() == stages() - 1) {
    double sum = 0;
    for (double l : losses) sum += l;
    mean.fill_(losses.empty() ? 0.0 : sum / double(losses.size()));
    if (parallel_.data().size() > 1) parallel_.data().all_reduce(mean, ReduceOp::Avg);
  }
  if (stages() > 1) parallel_.pipe().broadcast(mean, stages() - 1);
  return mean.item<double>();
}

double PipelineEngine::train_batch(const MicroBatchSource& data) {
  Stage stage(*this, data);
  report_ = executor_->run(stage);
  const double loss = mean_loss(report_.losses);
  engine_->record_loss(loss);
  engine_->step();  // the boundary: the optimizer step (and the progress line when due)
  return loss;
}

double PipelineEngine::eval_batch(const MicroBatchSource& data) {
  at::NoGradGuard no_grad;
  if (!eval_executor_)
    eval_executor_ = std::make_unique<PipelineExecutor>(
        parallel_.pipe(), pipeline::forward_only(stages(), executor_->schedule().micro_batches),
        engine_->config().pipeline.dynamic_shape);
  Stage stage(*this, data);
  engine_->wait_for_parameters();
  BatchReport report = eval_executor_->run(stage);
  return mean_loss(report.losses);
}

}  // namespace tessera
