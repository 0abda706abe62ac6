// Runs one stage's instruction list (schedule.h) for one batch: the loads, forwards and backwards
// through a PipelineStage the caller implements (the Engine's pipeline mode, a test's model), the
// sends and receives through a StageLink (p2p.h). It holds each micro-batch's stage input and
// output from its Forward to its Backward, and records when every instruction ran, so the measured
// bubble and activation count can be set beside the simulator's.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"

namespace tessera::pipeline {

// What a stage computes; the executor decides when.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // LoadMicroBatch: the first stage takes its inputs, the loss's stage (the last, or stage 0 under
  // zb_v) its labels; once per micro-batch where one stage does both.
  virtual void load(int micro_batch) = 0;
  // This stage's layers on `input` (undefined on the first stage: it reads what load() took).
  // The last stage returns the micro-batch's loss (a scalar the executor back-propagates as is:
  // divide by the number of micro-batches there for the batch's mean); the others their output.
  virtual at::Tensor forward(int micro_batch, const at::Tensor& input) = 0;
  // Interleaved schedules: the stage's model chunk `chunk` (0 .. v − 1, the model's chunk
  // stage + chunk·p); the first and last are those of the model's first and last chunks. The
  // default runs forward() for chunk 0 and refuses the others (a stage of one chunk).
  virtual at::Tensor forward(int micro_batch, int chunk, const at::Tensor& input);
  // What the backward of (micro-batch, chunk) starts from: the stage's output (or the loss) with
  // `grad`, the gradient received from the next stage (undefined on the last: the default then
  // back-propagates the loss as is). The Engine adds its loss scale and the auxiliary losses.
  struct BackwardRoots {
    std::vector<at::Tensor> outputs, grads;
  };
  virtual BackwardRoots backward_roots(int micro_batch, int chunk, const at::Tensor& output, const at::Tensor& grad);
  // Runs `pass`, the autograd pass that leaves the micro-batch's gradients in the weights' .grad (a
  // whole backward, or a split schedule's W; split_backward.h), once per (micro-batch, chunk). The
  // default runs it; the Engine runs it as its backward (its reductions, its micro-step count).
  virtual void weight_pass(int micro_batch, int chunk, const std::function<void()>& pass) { pass(); }
  // Runs one Forward, Backward or BackwardWeight instruction's work (a ZeRO-3 stage gathers its
  // parameters around it when they are gathered per micro-batch).
  virtual void compute(const std::function<void()>& work) { work(); }
  virtual void reduce_tied_grads() {}
  virtual void step() = 0;
};

struct BatchReport {
  std::vector<TimedInstruction> timeline;  // seconds since the batch began, in program order
  std::vector<double> losses;              // the last stage: each micro-batch's loss, as returned (read
                                           // from the device once, after the batch)
  int peak_activations = 0;                // most micro-batches held at once
  double seconds = 0;                      // the whole batch
  double began = 0;                        // when it began, seconds on the host's steady (monotonic)
                                           // clock: the stages on one host share it (measured_costs.h)
  double compute_seconds = 0;              // in forward() and backward()
  double idle_fraction() const { return seconds > 0 ? 1.0 - compute_seconds / seconds : 0.0; }
};

class PipelineExecutor {
 public:
  // `pipe`: the pipe axis's communicator (group rank = stage). The schedule must pass check().
  PipelineExecutor(Communicator& pipe, Schedule schedule, bool dynamic_shape = false);
  // Runs this stage's list once: one batch of schedule.micro_batches micro-batches and the step.
  BatchReport run(PipelineStage& stage);
  const Schedule& schedule() const { return schedule_; }
  const StageLink& link() const { return link_; }

 private:
  Communicator& pipe_;
  Schedule schedule_;
  StageLink link_;
};

}  // namespace tessera::pipeline
