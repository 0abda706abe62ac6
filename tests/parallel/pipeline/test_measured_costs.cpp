// The simulator's costs read back off a batch's timelines (parallel/pipeline/measured_costs.h):
// the simulator's own timeline, made with known costs, is a measurement whose answer is known.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline/measured_costs.h"

using namespace tessera::pipeline;

namespace {

// A batch whose instructions each took their own time: compute spread by ±`spread` of its mean,
// varying along the list (a deterministic pattern); receives 0.1 once their data is there.
Costs spread_costs(const Schedule& schedule, double spread) {
  Costs c;
  c.send = 0.25, c.receive.assign(schedule.stages, 0.1);
  for (int s = 0; s < schedule.stages; ++s) {
    c.own.emplace_back();
    for (size_t i = 0; i < schedule.stage[s].size(); ++i) {
      const Op op = schedule.stage[s][i].op;
      const bool compute = op == Op::Forward || op == Op::Backward || op == Op::BackwardWeight;
      const bool receive = op == Op::RecvActivation || op == Op::RecvGrad;
      const double wobble = 1.0 + spread * std::sin(1.7 * static_cast<double>(i) + 2.3 * s);
      c.own.back().push_back(compute ? (op == Op::Forward ? 1.0 : 1.5) * wobble : receive ? 0.1 : 0.01);
    }
  }
  return c;
}

Costs some_costs(bool split) {
  Costs c;
  c.forward = 1.3, c.backward = 2.1, c.weight_share = split ? 0.6 : 0.5;
  c.send = 0.25, c.load = 0.05, c.reduce_tied = 0.1, c.optimizer_step = 0.4;
  return c;
}

}  // namespace

TEST_CASE("measured_costs: the costs a simulated batch ran with, from its timelines, for every schedule", "[pipeline]") {
  struct Case {
    std::string name;
    int p, m, v;
  };
  for (const Case& c : {Case{"1f1b", 4, 8, 1}, Case{"gpipe", 3, 5, 1}, Case{"interleaved_1f1b", 2, 4, 2},
                        Case{"interleaved_1f1b", 4, 8, 3}, Case{"zb_h1", 4, 8, 1}, Case{"zb_v", 2, 8, 2}, Case{"zb_v", 4, 8, 2}}) {
    const Schedule schedule = make_schedule(c.name, c.p, c.m, c.v);
    for (const bool sends_cost : {true, false}) {
      INFO(c.name << " p " << c.p << " m " << c.m << " v " << c.v << (sends_cost ? ", sends with latency" : ", free sends"));
      Costs truth = some_costs(schedule.split_backward);
      if (sends_cost) truth.receive.assign(c.p, 0.1), truth.posting.assign(c.p, 0.02);
      else truth.send = 0;
      const Simulation ran = simulate(schedule, truth);
      const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
      CHECK(measured.costs.forward == Approx(truth.forward));
      CHECK(measured.costs.backward == Approx(truth.backward));
      CHECK(measured.costs.weight_share == Approx(truth.weight_share));
      CHECK(measured.costs.send == Approx(truth.send).margin(1e-12));
      // A stage's receive cost from its receives posted after their data came (a stage that always
      // waits has none: 0, and it times the same).
      int read = 0;
      for (int s = 0; s < c.p; ++s) {
        const double r = measured.costs.receive[s];
        CHECK((r == 0.0 || r == Approx(0.1)));
        read += r > 0;
      }
      CHECK((read > 0) == sends_cost);
      for (int s = 0; s < c.p; ++s) CHECK(measured.costs.posting[s] == Approx(sends_cost ? 0.02 : 0.0).margin(1e-12));
      CHECK(measured.costs.load == Approx(truth.load));
      CHECK(measured.costs.reduce_tied == Approx(truth.reduce_tied));
      CHECK(measured.costs.optimizer_step == Approx(truth.optimizer_step));
      CHECK(measured.timed_transfers > 0);
      // Timed again with what was read, the batch is the same batch; its idle measured on the
      // stages' shared span is the simulator's.
      const Simulation again = simulate(schedule, measured.costs);
      CHECK(again.makespan == Approx(ran.makespan));
      const std::vector<double> idle = measured_idle(ran.timeline);
      for (int s = 0; s < c.p; ++s) {
        CHECK(again.idle_fraction[s] == Approx(ran.idle_fraction[s]));
        CHECK(idle[s] == Approx(ran.idle_fraction[s]));
      }
    }
  }
}

TEST_CASE("measured_costs: V's turn is in-process - it costs no latency and is not a transfer", "[pipeline]") {
  // p = 2: per micro-batch each stage receives one activation and one gradient across the link;
  // stage 1 also hands chunk 0's output to its chunk 1 (and the gradient back) without a link.
  const Schedule schedule = make_schedule("zb_v", 2, 4, 2);
  Costs costs = some_costs(true);
  costs.send = 0.5;
  const Simulation ran = simulate(schedule, costs);
  for (const TimedInstruction& t : ran.timeline[1])
    if (t.instruction.op == Op::RecvActivation && t.instruction.chunk == 1) CHECK(t.end == t.start);
  const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
  CHECK(measured.costs.send == Approx(0.5));
  CHECK(measured.timed_transfers <= 2 * 2 * 4);
}

TEST_CASE("measured_costs: a timeline that is not the schedule's is refused naming the stage", "[pipeline]") {
  const Schedule schedule = make_schedule("1f1b", 2, 3);
  std::vector<std::vector<TimedInstruction>> timelines = simulate(schedule).timeline;
  timelines[1].pop_back();
  CHECK_THROWS_WITH(measured_costs(schedule, timelines), Catch::Contains("stage 1's timeline is not its list"));
  timelines.pop_back();
  CHECK_THROWS_WITH(measured_costs(schedule, timelines), Catch::Contains("1 timelines for a schedule of 2 stages"));
}

TEST_CASE("measured_costs: each stage's chunks as they ran - an uneven pipeline idles where the mean does not", "[pipeline]") {
  // ZB-H1 at p = 2 as the benchmark's GPT runs it: stage 0's chunk has no B (the model's first
  // chunk), its whole backward at W; stage 1's backward 5% slower than stage 0's.
  const Schedule schedule = make_schedule("zb_h1", 2, 8);
  Costs uneven;
  uneven.chunks = {{ChunkCosts{1.0, 0.0, 2.0}}, {ChunkCosts{1.0, 1.05, 1.05}}};
  const Simulation ran = simulate(schedule, uneven);
  const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
  for (int s = 0; s < 2; ++s) {
    CHECK(measured.costs.chunks[s][0].forward == Approx(uneven.chunks[s][0].forward));
    CHECK(measured.costs.chunks[s][0].backward == Approx(uneven.chunks[s][0].backward).margin(1e-12));
    CHECK(measured.costs.chunks[s][0].weight == Approx(uneven.chunks[s][0].weight));
  }
  CHECK(simulate(schedule, measured.costs).makespan == Approx(ran.makespan));
  // The means (a stage's F 1.0, backward 2.05, W half of stage 1's) balance the stages: stage 0
  // no longer waits for the slower one at the end.
  Costs mean = measured.costs;
  mean.chunks.clear();
  CHECK(mean.backward == Approx(2.05));
  CHECK(mean.weight_share == Approx(0.5));
  CHECK(simulate(schedule, mean).idle_fraction[0] < ran.idle_fraction[0] - 0.01);
  // A table that is not the schedule's shape is refused.
  Costs wrong;
  wrong.chunks = {{ChunkCosts{1, 1, 1}}};
  CHECK_THROWS_WITH(simulate(schedule, wrong), Catch::Contains("per-chunk costs for 1 stages, the schedule has 2 stages of 1 chunks"));
}

TEST_CASE("own_costs: a batch whose every instruction took its own time is replayed exactly", "[pipeline]") {
  for (const char* name : {"1f1b", "interleaved_1f1b", "zb_h1", "zb_v"}) {
    const int v = std::string(name) == "interleaved_1f1b" || std::string(name) == "zb_v" ? 2 : 1;
    const Schedule schedule = make_schedule(name, 4, 8, v);
    INFO(name);
    const Simulation ran = simulate(schedule, spread_costs(schedule, 0.3));
    const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
    Costs replay = measured.costs;
    replay.own = own_costs(schedule, measured, ran.timeline);
    const Simulation again = simulate(schedule, replay);
    CHECK(again.makespan == Approx(ran.makespan));
    for (int s = 0; s < 4; ++s) CHECK(again.idle_fraction[s] == Approx(ran.idle_fraction[s]));
    // The same batch timed by its mean costs idles less: a stage waits for the later of two
    // producers at their means, not at their actual times.
    double ran_idle = 0, mean_idle = 0;
    const Simulation mean = simulate(schedule, measured.costs);
    for (int s = 0; s < 4; ++s) ran_idle += ran.idle_fraction[s], mean_idle += mean.idle_fraction[s];
    CHECK(mean_idle < ran_idle);
  }
}

TEST_CASE("expected_idle: the mean over the costs redrawn from the batch's own spread", "[pipeline]") {
  const Schedule schedule = make_schedule("zb_v", 4, 8, 2);
  // Without spread every draw is the batch: mean, low and high are its idle.
  Costs plain = some_costs(true);
  plain.receive.assign(4, 0.1);
  const Simulation steady = simulate(schedule, plain);
  const ExpectedIdle same = expected_idle(schedule, measured_costs(schedule, steady.timeline), steady.timeline, 20);
  for (int s = 0; s < 4; ++s) {
    CHECK(same.mean[s] == Approx(steady.idle_fraction[s]));
    CHECK(same.low[s] == Approx(steady.idle_fraction[s]));
    CHECK(same.high[s] == Approx(steady.idle_fraction[s]));
  }
  // With spread: above the mean-cost simulation's on every stage, a range around it, the same draws
  // for the same seed.
  const Simulation ran = simulate(schedule, spread_costs(schedule, 0.3));
  const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
  const Simulation mean = simulate(schedule, measured.costs);
  const ExpectedIdle expected = expected_idle(schedule, measured, ran.timeline, 100, 7);
  for (int s = 0; s < 4; ++s) {
    INFO("stage " << s);
    CHECK(expected.mean[s] > mean.idle_fraction[s]);
    CHECK(expected.replayed[s] == Approx(ran.idle_fraction[s]));  // the batch itself
    CHECK(expected.low[s] < expected.mean[s]);
    CHECK(expected.high[s] > expected.mean[s]);
  }
  CHECK(expected_idle(schedule, measured, ran.timeline, 100, 7).mean == expected.mean);
  CHECK_THROWS_WITH(expected_idle(schedule, measured, ran.timeline, 0), Catch::Contains("at least one draw, got 0"));
}

TEST_CASE("simulate: per-instruction and posting costs of another shape are refused", "[pipeline]") {
  const Schedule schedule = make_schedule("1f1b", 2, 4);
  Costs costs;
  costs.posting = {0.1};
  CHECK_THROWS_WITH(simulate(schedule, costs), Catch::Contains("posting costs for 1 stages, the schedule has 2"));
  costs = spread_costs(schedule, 0.1);
  costs.own[1].pop_back();
  CHECK_THROWS_WITH(simulate(schedule, costs), Catch::Contains("own cost must be given for every stage's list"));
}

TEST_CASE("measured_idle: over the stages' shared span, not each stage's own", "[pipeline]") {
  // Stage 0 computes 0-1 and ends; stage 1 waits, computes 0.5-2.5. Over its own span stage 0 never
  // idles; over the batch's (0-2.5) it idles 60%.
  const std::vector<std::vector<TimedInstruction>> timelines{
      {{{Op::Forward, 0}, 0.0, 1.0}, {{Op::SendActivation, 0}, 1.0, 1.0}},
      {{{Op::RecvActivation, 0}, 0.2, 0.5}, {{Op::Forward, 0}, 0.5, 2.5}}};
  const std::vector<double> idle = measured_idle(timelines);
  CHECK(idle[0] == Approx(0.6));
  CHECK(idle[1] == Approx(0.2));
}
