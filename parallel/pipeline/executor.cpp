#include "parallel/pipeline/executor.h"

#include <ATen/ops/ones_like.h>
#include <ATen/ops/stack.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

#include "parallel/pipeline/split_backward.h"

namespace tessera::pipeline {

PipelineStage::BackwardRoots PipelineStage::backward_roots(int, int, const at::Tensor& output, const at::Tensor& grad) {
  return {{output}, {grad.defined() ? grad : at::ones_like(output)}};
}

at::Tensor PipelineStage::forward(int micro_batch, int chunk, const at::Tensor& input) {
  if (chunk != 0)
    throw std::invalid_argument("pipeline: this stage holds one model chunk; an interleaved schedule asked for chunk " +
                                std::to_string(chunk));
  return forward(micro_batch, input);
}

PipelineExecutor::PipelineExecutor(Communicator& pipe, Schedule schedule, bool dynamic_shape)
    : pipe_(pipe), schedule_(std::move(schedule)), link_(pipe, dynamic_shape) {
  if (schedule_.stages != pipe_.size())
    throw std::invalid_argument("pipeline: a schedule of " + std::to_string(schedule_.stages) + " stages on a pipe group of " +
                                std::to_string(pipe_.size()) + " ranks (pipeline.stages must equal the pipe degree)");
  if (schedule_.chunks > 1 && schedule_.stages == 1)
    throw std::invalid_argument("pipeline: " + std::to_string(schedule_.chunks) + " model chunks on a single stage: "
                                "interleaving needs pipeline.stages >= 2");
  std::vector<std::string> errors = check(schedule_);
  if (errors.empty()) errors = stream_order_errors(schedule_);
  if (!errors.empty()) throw std::invalid_argument("pipeline schedule \"" + schedule_.name + "\" is malformed: " + errors.front());
}

BatchReport PipelineExecutor::run(PipelineStage& stage) {
  using clock = std::chrono::steady_clock;
  const int s = pipe_.rank(), p = schedule_.stages, m = schedule_.micro_batches, v = schedule_.chunks;
  // Each chunk's neighbours: the previous and next stages (across the loop placement's wrap-around,
  // the last stage's chunk c feeds the first stage's chunk c + 1), or this stage itself at V's turn.
  const ChunkLayout layout = schedule_.layout();
  // V's turn: chunk 0's output and chunk 1's input gradient handed over in-process, by micro-batch.
  std::map<std::pair<Stream, int>, at::Tensor> handed;
  auto send = [&](const at::Tensor& t, int peer, Stream stream, int mb) {
    if (peer == s) handed[{stream, mb}] = stream == Stream::Activation ? t.detach() : t;
    else link_.send(t, peer, stream);
  };
  // Each link stream's receives still to come this batch: one is kept posted ahead on each, so its
  // transfer lands while the stage computes (p2p.h); none is left posted after the batch. Only on
  // host groups (Gloo: each message matched by its tag, sends and receives independent); NCCL
  // matches a pair's messages in issue order on one stream, where a receive posted early would
  // hold this stage's sends behind it.
  const bool post_ahead = pipe_.device().is_cpu();
  std::map<std::pair<int, Stream>, int> to_come;
  for (const Instruction& ins : schedule_.stage[s]) {
    if (ins.op != Op::RecvActivation && ins.op != Op::RecvGrad) continue;
    const bool activation = ins.op == Op::RecvActivation;
    const int peer = activation ? layout.previous_stage(s, ins.chunk) : layout.next_stage(s, ins.chunk);
    if (peer != s) ++to_come[{peer, activation ? Stream::Activation : Stream::Gradient}];
  }
  if (post_ahead)
    for (const auto& [key, count] : to_come) link_.post_recv(key.first, key.second);
  auto recv = [&](int peer, Stream stream, int mb) {
    if (peer != s) {
      at::Tensor t = link_.recv(peer, stream);
      if (--to_come[{peer, stream}] > 0 && post_ahead) link_.post_recv(peer, stream);
      return t;
    }
    auto it = handed.find({stream, mb});
    if (it == handed.end()) throw std::logic_error("pipeline: a receive from this stage before its send");
    at::Tensor t = std::move(it->second);
    handed.erase(it);
    return t;
  };
  // Per (chunk, micro-batch), from its Forward to its Backward: the stage's input (a leaf whose
  // gradient goes back) and its output (or the loss); then the input's gradient until SendGrad.
  std::vector<at::Tensor> inputs(v * m), outputs(v * m), grads(v * m), input_grads(v * m);
  // Split schedules, from B to W: the input's path already back-propagated, or (the model's first
  // chunk, which sends nothing back) the whole backward's roots.
  std::vector<std::unique_ptr<SplitBackward>> splits(v * m);
  std::vector<PipelineStage::BackwardRoots> deferred(v * m);
  std::vector<at::Tensor> losses;  // the last stage's, read to the host once at the end
  BatchReport report;
  int held = 0;
  const auto began = clock::now();
  report.began = std::chrono::duration<double>(began.time_since_epoch()).count();
  auto since = [&](clock::time_point t) { return std::chrono::duration<double>(t - began).count(); };

  for (const Instruction& ins : schedule_.stage[s]) {
    const auto start = clock::now();
    const int mb = ins.micro_batch, c = ins.chunk, at = c * m + std::max(mb, 0);
    const bool first = layout.first(s, c), last = layout.last(s, c);  // the model's first and last chunks
    switch (ins.op) {
      case Op::LoadMicroBatch: stage.load(mb); break;
      case Op::RecvActivation: inputs[at] = recv(layout.previous_stage(s, c), Stream::Activation, mb).requires_grad_(true); break;
      case Op::Forward: {
        stage.compute([&] { outputs[at] = stage.forward(mb, c, inputs[at]); });
        if (!last && outputs[at].dim() == 0)
          throw std::invalid_argument("pipeline: stage " + std::to_string(s) + " of " + std::to_string(p) +
                                      " returned a scalar from its forward (micro-batch " + std::to_string(mb) +
                                      "): only the last stage computes the loss; the others return their activations");
        if (last) {
          if (outputs[at].numel() != 1)
            throw std::invalid_argument("pipeline: the last stage's forward must return the micro-batch's loss (a scalar), got shape " +
                                        c10::str(outputs[at].sizes()));
          losses.push_back(outputs[at].detach().reshape({}));
        }
        report.peak_activations = std::max(report.peak_activations, ++held);
        if (!schedule_.training && last) {
          inputs[at] = outputs[at] = at::Tensor();
          --held;
        }
        break;
      }
      case Op::SendActivation:
        send(outputs[at], layout.next_stage(s, c), Stream::Activation, mb);
        if (!schedule_.training) {  // evaluation: nothing is kept for a backward
          inputs[at] = outputs[at] = at::Tensor();
          --held;
        }
        break;
      case Op::RecvGrad: grads[at] = recv(layout.next_stage(s, c), Stream::Gradient, mb); break;
      case Op::Backward: {
        PipelineStage::BackwardRoots roots = stage.backward_roots(mb, c, outputs[at], grads[at]);
        if (schedule_.split_backward) {  // B: the input's gradient now, the weights' at BackwardWeight
          if (first) deferred[at] = std::move(roots);
          else {
            stage.compute([&] {
              splits[at] = std::make_unique<SplitBackward>(std::move(roots.outputs), std::move(roots.grads), inputs[at]);
            });
            input_grads[at] = splits[at]->input_gradient();
          }
          grads[at] = at::Tensor();
          break;
        }
        stage.compute([&] { stage.weight_pass(mb, c, [&] { torch::autograd::backward(roots.outputs, roots.grads); }); });
        if (!first) {
          input_grads[at] = inputs[at].grad();
          if (!input_grads[at].defined())
            throw std::runtime_error("pipeline: stage " + std::to_string(s) + "'s output does not depend on its input " +
                                     "(micro-batch " + std::to_string(mb) + "): no gradient to send back");
        }
        inputs[at] = outputs[at] = grads[at] = at::Tensor();  // the micro-batch's activations are freed
        --held;
        break;
      }
      case Op::BackwardWeight:
        stage.compute([&] {
          stage.weight_pass(mb, c, [&] {
            if (splits[at]) splits[at]->weights();
            else torch::autograd::backward(deferred[at].outputs, deferred[at].grads);
          });
        });
        splits[at].reset();
        deferred[at] = {};
        inputs[at] = outputs[at] = at::Tensor();  // freed only now: W reads what the forward saved
        --held;
        break;
      case Op::SendGrad:
        send(input_grads[at], layout.previous_stage(s, c), Stream::Gradient, mb);
        input_grads[at] = at::Tensor();  // the link keeps it until sent
        break;
      case Op::ReduceTiedGrads: stage.reduce_tied_grads(); break;
      case Op::OptimizerStep:
        link_.wait_sends();
        stage.step();
        break;
    }
    const auto end = clock::now();
    if (ins.op == Op::Forward || ins.op == Op::Backward || ins.op == Op::BackwardWeight) report.compute_seconds += std::chrono::duration<double>(end - start).count();
    report.timeline.push_back({ins, since(start), since(end)});
  }
  if (!schedule_.training) link_.wait_sends();
  if (link_.posted() != 0) throw std::logic_error("pipeline: a receive was posted ahead that this batch did not make");
  if (!losses.empty()) {
    const at::Tensor values = at::stack(losses).to(at::kCPU, at::kDouble);
    report.losses.assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  }
  report.seconds = since(clock::now());
  return report;
}

}  // namespace tessera::pipeline
