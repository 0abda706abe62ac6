#include "parallel/pipeline/executor.h"

#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace tessera::pipeline {

void PipelineStage::backward(int, const at::Tensor& output, const at::Tensor& grad) {
  torch::autograd::backward({output}, grad.defined() ? std::vector<at::Tensor>{grad} : std::vector<at::Tensor>{});
}

PipelineExecutor::PipelineExecutor(Communicator& pipe, Schedule schedule, bool dynamic_shape)
    : pipe_(pipe), schedule_(std::move(schedule)), link_(pipe, dynamic_shape) {
  if (schedule_.stages != pipe_.size())
    throw std::invalid_argument("pipeline: a schedule of " + std::to_string(schedule_.stages) + " stages on a pipe group of " +
                                std::to_string(pipe_.size()) + " ranks (pipeline.stages must equal the pipe degree)");
  std::vector<std::string> errors = check(schedule_);
  if (errors.empty()) errors = stream_order_errors(schedule_);
  if (!errors.empty()) throw std::invalid_argument("pipeline schedule \"" + schedule_.name + "\" is malformed: " + errors.front());
}

BatchReport PipelineExecutor::run(PipelineStage& stage) {
  using clock = std::chrono::steady_clock;
  const int s = pipe_.rank(), m = schedule_.micro_batches;
  const bool first = s == 0, last = s == schedule_.stages - 1;
  // Per micro-batch, from its Forward to its Backward: the stage's input (a leaf whose gradient
  // goes back) and its output (or the loss); then the input's gradient until SendGrad.
  std::vector<at::Tensor> inputs(m), outputs(m), grads(m), input_grads(m);
  std::vector<at::Tensor> losses;  // the last stage's, read to the host once at the end
  BatchReport report;
  int held = 0;
  const auto began = clock::now();
  auto since = [&](clock::time_point t) { return std::chrono::duration<double>(t - began).count(); };

  for (const Instruction& ins : schedule_.stage[s]) {
    const auto start = clock::now();
    const int mb = ins.micro_batch;
    switch (ins.op) {
      case Op::LoadMicroBatch: stage.load(mb); break;
      case Op::RecvActivation: inputs[mb] = link_.recv(s - 1, Stream::Activation).requires_grad_(true); break;
      case Op::Forward: {
        outputs[mb] = stage.forward(mb, inputs[mb]);
        if (!last && outputs[mb].dim() == 0)
          throw std::invalid_argument("pipeline: stage " + std::to_string(s) + " of " + std::to_string(schedule_.stages) +
                                      " returned a scalar from its forward (micro-batch " + std::to_string(mb) +
                                      "): only the last stage computes the loss; the others return their activations");
        if (last) {
          if (outputs[mb].numel() != 1)
            throw std::invalid_argument("pipeline: the last stage's forward must return the micro-batch's loss (a scalar), got shape " +
                                        c10::str(outputs[mb].sizes()));
          losses.push_back(outputs[mb].detach().reshape({}));
        }
        report.peak_activations = std::max(report.peak_activations, ++held);
        if (!schedule_.training && last) {
          inputs[mb] = outputs[mb] = at::Tensor();
          --held;
        }
        break;
      }
      case Op::SendActivation:
        link_.send(outputs[mb], s + 1, Stream::Activation);
        if (!schedule_.training) {  // evaluation: nothing is kept for a backward
          inputs[mb] = outputs[mb] = at::Tensor();
          --held;
        }
        break;
      case Op::RecvGrad: grads[mb] = link_.recv(s + 1, Stream::Gradient); break;
      case Op::Backward:
        stage.backward(mb, outputs[mb], grads[mb]);
        if (!first) {
          input_grads[mb] = inputs[mb].grad();
          if (!input_grads[mb].defined())
            throw std::runtime_error("pipeline: stage " + std::to_string(s) + "'s output does not depend on its input " +
                                     "(micro-batch " + std::to_string(mb) + "): no gradient to send back");
        }
        inputs[mb] = outputs[mb] = grads[mb] = at::Tensor();  // the micro-batch's activations are freed
        --held;
        break;
      case Op::SendGrad:
        link_.send(input_grads[mb], s - 1, Stream::Gradient);
        input_grads[mb] = at::Tensor();  // the link keeps it until sent
        break;
      case Op::ReduceTiedGrads: stage.reduce_tied_grads(); break;
      case Op::OptimizerStep:
        link_.wait_sends();
        stage.step();
        break;
    }
    const auto end = clock::now();
    if (ins.op == Op::Forward || ins.op == Op::Backward) report.compute_seconds += std::chrono::duration<double>(end - start).count();
    report.timeline.push_back({ins, since(start), since(end)});
  }
  if (!schedule_.training) link_.wait_sends();
  if (!losses.empty()) {
    const at::Tensor values = at::stack(losses).to(at::kCPU, at::kDouble);
    report.losses.assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  }
  report.seconds = since(clock::now());
  return report;
}

}  // namespace tessera::pipeline
