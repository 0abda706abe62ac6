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
//   ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", the V-shape zero bubble;
//   the same placement as DualPipeV): two chunks per stage placed in a V — stage s holds the model's
//   chunks s and 2p − 1 − s — so a micro-batch goes down the stages and back up: the last stage hands
//   chunk p − 1's output to its own chunk p without a send, and stage 0 holds both the embedding side
//   and the loss. Each backward split into B and W as in ZB-H1. The lists come from a list scheduler
//   (zb_v below) that runs the stages forward in time with F = B = W per chunk (the model's first
//   chunk as the executor runs it: no B, its whole backward at W) and lets each stage,
//   when free, run a ready B first (the critical path), else a ready F while it holds fewer than 2p
//   chunk activations (1F1B's peak: p stage-sized micro-batches), else a deferred W, else wait; the
//   order found is deadlock-free under any costs (every receive follows its send in one timing).
//   With m >= 2p its bubble is never above ZB-H1's, below it from p = 4, at the same peak activations.
//
// Instructions name a micro-batch and a model chunk (0 but for interleaved and V schedules). Backward is
// the whole backward of a micro-batch, or in a split schedule (Schedule::split_backward) its B, with
// BackwardWeight its W.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
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

// Where the model's stages·chunks chunks sit (torchtitan calls it the stage style). Loop: stage s
// holds chunks s, s + p, ... (one chunk, interleaved 1F1B). V (zb_v, two chunks): s and 2p − 1 − s.
enum class Placement { Loop, V };

// Stage s's local chunk `chunk` in the model: p stages, v chunks each.
struct ChunkLayout {
  int stages = 1, chunks = 1;
  Placement placement = Placement::Loop;
  int model_chunk(int s, int chunk) const;
  // The (stage, local chunk) that holds model chunk g.
  std::pair<int, int> place(int g) const;
  bool first(int s, int chunk) const { return model_chunk(s, chunk) == 0; }
  bool last(int s, int chunk) const { return model_chunk(s, chunk) == stages * chunks - 1; }
  int last_stage() const { return place(stages * chunks - 1).first; }  // the loss's stage
  // LoadMicroBatch before this chunk's forward: the first chunk's (inputs), and the last chunk's
  // (labels) where its stage does not hold the first too (V: stage 0 loads once per micro-batch).
  bool loads(int s, int chunk) const { return first(s, chunk) || (last(s, chunk) && last_stage() != 0); }
  // The stages a chunk's activations come from and go to (its own stage at V's turn).
  int previous_stage(int s, int chunk) const { return place(model_chunk(s, chunk) - 1).first; }
  int next_stage(int s, int chunk) const { return place(model_chunk(s, chunk) + 1).first; }
};

struct Schedule {
  std::string name;                              // "1f1b", "gpipe", "forward_only"
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Instruction>> stage;   // stage[s]: what stage s runs, in order
  bool training = true;                          // false: forwards only (evaluation), no step
  int chunks = 1;                                // model chunks per stage (interleaved: v; V: 2)
  bool split_backward = false;                   // Backward is B (input gradient); BackwardWeight is W
  Placement placement = Placement::Loop;
  ChunkLayout layout() const { return {stages, chunks, placement}; }
};

// Stage s's instructions to run micro-batch mb's forward / backward through its model chunk `chunk`
// of `layout`, with the loads, receives and sends that chunk's place in the pipeline needs (the
// model's first chunk loads the inputs, its last the labels; with the loop placement chunk c of the
// last stage sends to chunk c + 1 of stage 0). The schedules below are made of these two and the
// closing pair.
std::vector<Instruction> forward_pass(int s, const ChunkLayout& layout, int mb, int chunk = 0);
std::vector<Instruction> backward_pass(int s, const ChunkLayout& layout, int mb, int chunk = 0);
inline std::vector<Instruction> forward_pass(int s, int stages, int mb, int chunk = 0, int chunks = 1) {
  return forward_pass(s, ChunkLayout{stages, chunks}, mb, chunk);
}
inline std::vector<Instruction> backward_pass(int s, int stages, int mb, int chunk = 0, int chunks = 1) {
  return backward_pass(s, ChunkLayout{stages, chunks}, mb, chunk);
}

Schedule gpipe(int stages, int micro_batches);
// Evaluation: every micro-batch's forward pass, nothing held after its send, no backward or step;
// with chunks, every micro-batch through chunk 0, then through chunk 1, ...
Schedule forward_only(int stages, int micro_batches, int chunks = 1, Placement placement = Placement::Loop);
Schedule one_f_one_b(int stages, int micro_batches);
// Interleaved 1F1B with `chunks` (v) model chunks per stage; micro_batches a multiple of stages.
Schedule interleaved_one_f_one_b(int stages, int micro_batches, int chunks);

// ZB-H1: 1F1B with each backward split into B and W, W's deferred into the bubbles.
Schedule zb_h1(int stages, int micro_batches);

// ZB-V: two chunks per stage in a V, each backward split, W's deferred into the bubbles.
Schedule zb_v(int stages, int micro_batches);

// The placement a schedule name implies ("zb_v": V; the others: loop), for cutting the model.
Placement placement_of(const std::string& schedule);

// By the config's name (`pipeline.schedule`): "1f1b", "gpipe", "zb_h1", "interleaved_1f1b" (with `chunks`,
// pipeline.virtual_stages) or "zb_v" (chunks 2). Errors name the path and the expected values, and ask for at least one
// stage and one micro-batch.
Schedule make_schedule(const std::string& name, int stages, int micro_batches, int chunks = 1);

// The schedule names make_schedule knows, for the config's check.
const std::vector<std::string>& schedule_names();

}  // namespace tessera::pipeline
