// Runs a pipeline schedule (schedule.h) without processes: checks that it is well formed and
// cannot deadlock, and times it with given costs, so a schedule's bubble and memory are known
// before a GPU is spent on it (and tests can compare them with the closed forms).
//
// The model is the executor's: each stage runs its list in order; a send never blocks (the
// executor posts it asynchronously); a receive waits for the matching send; ReduceTiedGrads is a
// collective every stage enters. A stage holds a micro-batch's activations from its Forward to its
// Backward (its BackwardWeight in a split schedule).
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace tessera::pipeline {

// One model chunk's Forward, Backward (a split schedule's B) and BackwardWeight (W) per micro-batch.
struct ChunkCosts {
  double forward = 0, backward = 0, weight = 0;
};

// What each instruction costs (time units; equal forward and backward costs on every stage give
// the textbook bubble). forward and backward are a whole stage's: a chunk of an interleaved
// schedule costs 1/v of them. Loads, steps and tied reductions cost nothing unless set.
struct Costs {
  double forward = 1.0;
  double backward = 1.0;
  double weight_share = 0.5;  // split schedules: W's share of the backward (B gets the rest)
  double send = 0.0;     // from the send until the receiver may start (a stage to itself: 0)
  // When set, receive[s]: what a receive on stage s takes when its data has long been sent (the
  // transport's own work; a busy host's threads waiting for a core), not less than the latency.
  std::vector<double> receive;
  double load = 0.0;
  double reduce_tied = 0.0;
  double optimizer_step = 0.0;
  // When set, chunks[s][c] is stage s's local chunk c as it is (a measured run's stages differ:
  // the embedding, the head and the loss sit on some), in place of the three above.
  std::vector<std::vector<ChunkCosts>> chunks;
  // When set, posting[s]: what a send to another stage takes stage s itself (the transport queueing
  // it; the stage goes on while it travels).
  std::vector<double> posting;
  // When set, own[s][i]: what stage s's i-th instruction takes of itself, in place of the costs above
  // (a receive: what it takes once its data is there, in place of receive[s]): a measured batch
  // replayed, or its costs redrawn (measured_costs.h). A receive still waits for its data; the tied
  // reduction waits for every stage and costs reduce_tied.
  std::vector<std::vector<double>> own;
};

struct TimedInstruction {
  Instruction instruction;
  double start = 0, end = 0;  // a receive's start is when it was posted, its end when the data came
};

struct Simulation {
  double makespan = 0;                            // when the last stage finished
  std::vector<double> busy;                       // per stage: time in Forward and Backward
  std::vector<double> idle_fraction;              // per stage: 1 − busy / makespan
  // Per stage: most micro-batches held at once (interleaved: (micro-batch, chunk) pairs, each 1/v
  // of the stage's layers: divide by Schedule::chunks for stage-sized micro-batches).
  std::vector<int> peak_activations;
  std::vector<std::vector<TimedInstruction>> timeline;  // per stage, in program order
};

// Every well-formedness error of `schedule` (empty: none): each micro-batch's forward and backward
// exactly once per stage and model chunk, in that order; the receives, sends and loads a stage's position needs,
// exactly once each and on the right side of its compute; no activation traffic off the ends of the
// pipeline; ReduceTiedGrads then OptimizerStep, once, last (a forward-only schedule: no backward
// side and neither of those).
std::vector<std::string> check(const Schedule& schedule);

// Every pair of stages whose stream of activations or gradients (p2p.h) is sent in another order
// than it is received (the transport matches each stream in order; empty: none). For a schedule
// that passes check().
std::vector<std::string> stream_order_errors(const Schedule& schedule);

// The send a receive on stage `s` matches: (sending stage, its op, micro-batch, chunk): the
// holder of the model chunk before (activations) or after (gradients) the receiving one (with the
// loop placement the previous stage's same chunk, or across the wrap-around the previous chunk; at
// V's turn the stage itself).
struct SendKey {
  int stage;
  Op op;
  int micro_batch, chunk;
  bool operator<(const SendKey& o) const;
};
SendKey matching_send(const ChunkLayout& layout, const Instruction& receive, int s);

// Times `schedule`. Throws std::invalid_argument with check()'s and stream_order_errors()'s
// errors, or std::runtime_error naming each stage's blocked instruction when the stages deadlock.
Simulation simulate(const Schedule& schedule, const Costs& costs = {});

}  // namespace tessera::pipeline
