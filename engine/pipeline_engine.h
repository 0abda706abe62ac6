// PipelineEngine: DeepSpeed's pipeline engine for a C++ model cut into stages. Each rank holds
// one stage (its layers, from partition_layers) and an Engine over that stage's parameters; one
// train_batch() runs gradient_accumulation_steps micro-batches through the pipeline by the
// configured schedule (pipeline.schedule: 1F1B, GPipe, ZB-H1, interleaved 1F1B over
// pipeline.virtual_stages model chunks, or ZB-V with two chunks a stage in a V,
// parallel/pipeline/schedule.h) and the optimizer step, and
// returns the batch's mean loss on every rank:
//
//   PipelineEngine pipe(config, ctx, stage_model, stage_params);
//   for (step ...) double loss = pipe.train_batch(next_micro_batch);
//
// Data and tensor parallelism compose as for the Engine (each stage's Engine reduces over the data
// group, at ZeRO 0-3: at ZeRO-3 the stage's parameters are partitioned over it and gathered once per
// batch or around each forward and backward, pipeline.zero3_gather; the gradient norm and the loss
// scaler's overflow are decided over all stages). Weights
// tied across stages (a GPT's embedding and head) sit in a parameter group of their own on each
// stage that holds them; their gradients are summed over those stages before the step, so the
// copies stay identical (the first holder counts them in the norm).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "parallel/pipeline/executor.h"

namespace tessera {

// This rank's stage of the model.
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  // The stage's layers: the first stage gets the micro-batch's inputs, the others the previous
  // stage's output.
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // Interleaved schedules (pipeline.virtual_stages v): this rank's model chunk `chunk` of v, the
  // model's chunk stage + chunk·p; zb_v: chunk 0 the model's chunk `stage`, chunk 1 its
  // 2p − 1 − stage (partition.h's stage_layer_ranges). The default is forward()
  // for chunk 0, and an error for the others (a stage of one chunk).
  virtual at::Tensor forward(int chunk, const at::Tensor& input);
  // The loss's stage (the last; stage 0 under zb_v): the micro-batch's mean loss from its output and the labels.
  virtual at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) = 0;
  // Losses the forward just run added inside the stage (an MoE block's load-balancing loss), with
  // their graph, or undefined: back-propagated with the micro-batch's output at the loss's scale,
  // as if the last stage's loss included them (the model then leaves them out of loss()).
  virtual at::Tensor take_auxiliary_loss() { return {}; }
};

struct MicroBatch {
  at::Tensor inputs, labels;
};
// DeepSpeed's data iterator: the next micro-batch. Called on the first stage (which reads the
// inputs) and the loss's (the labels), once per micro-batch, in order; both must see the same data.
using MicroBatchSource = std::function<MicroBatch()>;

// A group of weights tied across stages: its index in each holding stage's ModelDescription, and
// the stages (pipe ranks, ascending) that hold it.
struct TiedGroup {
  int param_group = -1;
  std::vector<int> stages;
};

class PipelineEngine {
 public:
  // `stage_params`: this stage's parameters in optimizer groups (ModelDescription), tied groups
  // listed in `tied` when this stage holds them.
  PipelineEngine(Config config, ParallelContext& parallel, PipelineStageModel& model, ModelDescription stage_params,
                 std::vector<TiedGroup> tied = {});
  ~PipelineEngine();

  double train_batch(const MicroBatchSource& data);
  // Forwards only, without gradients: the batch's mean loss on every rank.
  double eval_batch(const MicroBatchSource& data);

  Engine& engine() { return *engine_; }
  const pipeline::BatchReport& last_report() const { return report_; }
  const pipeline::Schedule& schedule() const { return executor_->schedule(); }
  int stage() const;
  int stages() const;
  int last_stage() const;  // the stage that computes the loss: the last (stage 0 with zb_v's V placement)

 private:
  class Stage;
  double mean_loss(const std::vector<double>& losses);  // over micro-batches (last stage), then data ranks, on every stage
  // Runs `executor` over one batch, the stage's parameters whole meanwhile where gathered per batch.
  pipeline::BatchReport run_batch(pipeline::PipelineExecutor& executor, pipeline::PipelineStage& stage);

  ParallelContext& parallel_;
  PipelineStageModel& model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_, eval_executor_;
  std::vector<TiedGroup> tied_;
  int64_t micro_batch_size_ = 1;
  // ZeRO-3 (pipeline.zero3_gather): the stage gathers its parameters around the batch, or around
  // each forward and backward.
  bool gather_per_batch_ = false, gather_per_instruction_ = false;
  pipeline::BatchReport report_;
};

}  // namespace tessera
