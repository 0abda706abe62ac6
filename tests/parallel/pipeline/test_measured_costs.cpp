// The simulator's costs read back off a batch's timelines (parallel/pipeline/measured_costs.h):
// the simulator's own timeline, made with known costs, is a measurement whose answer is known.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "parallel/pipeline/measured_costs.h"

using namespace tessera::pipeline;

namespace {

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
      if (!sends_cost) truth.send = 0;
      const Simulation ran = simulate(schedule, truth);
      const MeasuredCosts measured = measured_costs(schedule, ran.timeline);
      CHECK(measured.costs.forward == Approx(truth.forward));
      CHECK(measured.costs.backward == Approx(truth.backward));
      CHECK(measured.costs.weight_share == Approx(truth.weight_share));
      CHECK(measured.costs.send == Approx(truth.send).margin(1e-12));
      CHECK(measured.costs.load == Approx(truth.load));
      CHECK(measured.costs.reduce_tied == Approx(truth.reduce_tied));
      CHECK(measured.costs.optimizer_step == Approx(truth.optimizer_step));
      CHECK(measured.timed_transfers > 0);
      // Timed again with what was read, the batch is the same batch.
      const Simulation again = simulate(schedule, measured.costs);
      CHECK(again.makespan == Approx(ran.makespan));
      for (int s = 0; s < c.p; ++s) CHECK(again.idle_fraction[s] == Approx(ran.idle_fraction[s]));
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
