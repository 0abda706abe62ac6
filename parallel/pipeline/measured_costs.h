// The simulator's Costs (simulator.h) read off one measured batch: every stage's timeline (the
// executor's BatchReport) on one clock. The simulator timed with them predicts what the run's own
// compute, transfers, loads and step allow, so a stage's measured idle time has a prediction beside
// it that counts what the run paid; with sends counted free it would blame the schedule for the link.
#pragma once

#include <vector>

#include "parallel/pipeline/simulator.h"

namespace tessera::pipeline {

struct MeasuredCosts {
  Costs costs;
  int timed_transfers = 0;  // the cross-stage receives the send latency comes from (0: none, send = 0)
};

// `timelines[s]`: stage s's instructions of one batch, in its program order (schedule.stage[s]), on
// a clock the stages share (the processes of one host: each time plus BatchReport::began).
//   chunks: each stage's chunks' F, B and W per micro-batch, as they ran (what simulate() times with);
//   forward, backward: their mean over the stages (all a stage's chunks together: the balanced model);
//   weight_share: W's share of the backward in the split chunks that send an input gradient (the
//     model's first chunk runs its whole backward at W);
//   send: the median, over the cross-stage receives posted before their send began (a receive posted
//     later may find the data there and hides the latency), of the send's start to the receive's end;
//   receive: per stage, the median time its cross-stage receives took when posted at least the
//     latency after their send began (the data there: the transport's own work, which on a host
//     whose cores all compute includes waiting for one);
//   posting: per stage, the median time its sends to another stage took it;
//   load, optimizer_step: the mean; reduce_tied: the shortest (each includes the wait for the last
//     stage to arrive; the last to arrive waits least).
// Throws std::invalid_argument when a timeline is not its stage's list.
MeasuredCosts measured_costs(const Schedule& schedule, const std::vector<std::vector<TimedInstruction>>& timelines);

// Each stage's idle fraction over the batch's span on the shared clock, from the first stage's
// start to the last stage's end: the simulator's definition (1 − busy / makespan). A stage's own
// BatchReport::idle_fraction is over its own span, which a stage that ends early (one without tied
// weights, which waits for the others in the step or the next batch's first receive) shortens.
std::vector<double> measured_idle(const std::vector<std::vector<TimedInstruction>>& timelines);

// Each instruction's own cost in the measured batch, for Costs::own (the batch replayed): compute,
// loads, sends and the step as they took; a cross-stage receive what it took when posted at least
// the latency after its send (its data there), else its stage's receive cost; V's turn 0.
std::vector<std::vector<double>> own_costs(const Schedule& schedule, const MeasuredCosts& measured,
                                           const std::vector<std::vector<TimedInstruction>>& timelines);

// The idle each stage can expect from the run's costs with their spread. Mean costs let a stage wait
// for the later of two producers at their means, but it waits for the later of their actual times,
// and the mean of a maximum exceeds the maximum of the means (Jensen), so a measured stage idles more
// than the mean-cost simulation says, the more so the more hand-offs its schedule has. Per draw,
// each instruction costs one of the durations its kind (op and chunk) took on its stage in the
// measured batch (own_costs: a receive's when its data was there), drawn with replacement (a
// bootstrap, seeded: the same draws each call); the transfers' latency and the tied reduction as in
// `measured.costs`. Per stage over `draws` simulations: the mean idle fraction and its 10th and
// 90th percentiles; and `replayed`, the idle of the batch replayed with each instruction's own cost
// (where it matches the measured idle, the simulator's model of the executor is right and what
// the mean-cost simulation misses is the spread).
struct ExpectedIdle {
  std::vector<double> mean, low, high, replayed;
};
ExpectedIdle expected_idle(const Schedule& schedule, const MeasuredCosts& measured,
                           const std::vector<std::vector<TimedInstruction>>& timelines, int draws = 200,
                           unsigned seed = 0);

}  // namespace tessera::pipeline
