// Pipeline schedules as data: for each stage, the list of instructions it runs for one batch of
// micro-batches. An executor interprets any such list, and the simulator (simulator.h) checks and
// times one without processes, so a new schedule (interleaved 1F1B, zero-bubble) is a new function
// returning lists, not a new executor.
//
//   GPipe (Huang et al. 2019): every forward, then every backward. Each stage holds all m
//   micro-batches' activations at once.
//   1F1B, PipeDream-flush (Narayanan et al. 2021, §2.2): stage s of p runs min(p − s − 1, m)
//   warm-up forwards, then alternates one forward and one backward, then drains the remaining
//   backwards. Stage s holds at most min(p − s, m) micro-batches of activations; the idle fraction
//   with equal stage costs is (p − 1) / (m + p − 1), the same bubble as GPipe's.
//
//   Interleaved 1F1B (Narayanan et al. 2021, §2.2.2): each stage holds v model chunks, stage s
//   chunks s, s + p, ..., s + (v − 1)·p of the p·v chunks the layers are cut into, so a micro-batch
//   crosses the stages v times. Micro-batches go in groups of p, each group through chunk 0, then
//   chunk 1, ...; backwards likewise from the last chunk. Stage s warms up with
//   (p − s − 1)·2 + (v − 1)·p chunk forwards, then alternates. A chunk's forward and backward cost
//   1/v of the stage's, so the idle fraction falls to (p − 1) / (v·m + p − 1); m must be a multiple
//   of p.
//
//   ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1): each backward split into B,
//   the gradient of the stage's input (sent upstream at once), and W, the gradients of its weights,
//   which may wait. Stage s runs 1F1B's warm-up, then F and B, deferring up to s W's (the later
//   stages, whose 1F1B memory is smaller, hold them), and spends the deferred W's in the cool-down
//   where 1F1B waits for gradients. Every stage holds at most p micro-batches, 1F1B's peak; the
//   idle time per stage falls from 1F1B's (p − 1)(F + B + W) to (p − 1)(F + B − W) (the paper's
//   figure; with F = B = W, a third).
//
// Instructions name a micro-batch and a model chunk (0 but for interleaved schedules). Backward is
// the whole backward of a micro-batch, or in a split schedule (Schedule::split_backward) its B, with
// BackwardWeight its W.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tessera::pipeline {

enum class Op {
  LoadMicroBatch,   // the data iterator's next micro-batch: inputs on the first stage, labels on the last
  RecvActivation,   // the previous stage's output for this micro-batch
  Forward,          // this stage's layers; the last stage also computes the loss
  SendActivation,   // this stage's output to the next stage
  RecvGrad,         // the gradient of this stage's output, from the next stage
  Backward,         // back-propagate this micro-batch through this stage's layers
  SendGrad,         // the gradient of this stage's input to the previous stage
  BackwardWeight,   // split schedules: the weights' gradients of a micro-batch whose Backward gave its input's
  ReduceTiedGrads,  // sum the gradients of weights shared between stages over the stages that hold them
  OptimizerStep,    // the stage's own parameters (data-parallel reduction, clipping, update)
};

const char* op_name(Op op);

struct Instruction {
  Op op;
  int micro_batch = -1;  // -1 for ReduceTiedGrads and OptimizerStep
  int chunk = 0;         // the model chunk on this stage (interleaved schedules)
  bool operator==(const Instruction& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

std::string to_string(const Instruction& i);  // "Forward(3)", "OptimizerStep"
std::ostream& operator<<(std::ostream& out, const Instruction& i);

struct Schedule {
  std::string name;                              // "1f1b", "gpipe", "forward_only"
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Instruction>> stage;   // stage[s]: what stage s runs, in order
  bool training = true;                          // false: forwards only (evaluation), no step
  int chunks = 1;                                // model chunks per stage (interleaved: v)
  bool split_backward = false;                   // Backward is B (input gradient); BackwardWeight is W
};

// Stage s's instructions to run micro-batch mb's forward / backward through its model chunk `chunk`
// of `chunks`, with the loads, receives and sends that chunk's place in the pipeline needs (the
// first chunk of stage 0 loads the inputs, the last chunk of the last stage the labels; chunk c
// of the last stage sends to chunk c + 1 of stage 0). The schedules below are made of these two
// and the closing pair.
std::vector<Instruction> forward_pass(int s, int stages, int mb, int chunk = 0, int chunks = 1);
std::vector<Instruction> backward_pass(int s, int stages, int mb, int chunk = 0, int chunks = 1);

Schedule gpipe(int stages, int micro_batches);
// Evaluation: every micro-batch's forward pass, nothing held after its send, no backward or step;
// with chunks, every micro-batch through chunk 0, then through chunk 1, ...
Schedule forward_only(int stages, int micro_batches, int chunks = 1);
Schedule one_f_one_b(int stages, int micro_batches);
// Interleaved 1F1B with `chunks` (v) model chunks per stage; micro_batches a multiple of stages.
Schedule interleaved_one_f_one_b(int stages, int micro_batches, int chunks);

// ZB-H1: 1F1B with each backward split into B and W, W's deferred into the bubbles.
Schedule zb_h1(int stages, int micro_batches);

// By the config's name (`pipeline.schedule`): "1f1b", "gpipe", "zb_h1" or "interleaved_1f1b" (with `chunks`,
// pipeline.virtual_stages). Errors name the path and the expected values, and ask for at least one
// stage and one micro-batch.
Schedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks = 1);

// The schedule names make_schedule knows, for the config's check.
const std::vector<std::string>& schedule_names();

}  // namespace tessera::pipeline
