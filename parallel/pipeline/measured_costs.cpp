#include "parallel/pipeline/measured_costs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

namespace tessera::pipeline {

namespace {

// Throws unless timelines[s] is stage s's list, instruction by instruction.
void check_timelines(const Schedule& schedule, const std::vector<std::vector<TimedInstruction>>& timelines) {
  const int p = schedule.stages;
  if (static_cast<int>(timelines.size()) != p)
    throw std::invalid_argument("pipeline: " + std::to_string(timelines.size()) + " timelines for a schedule of " +
                                std::to_string(p) + " stages");
  for (int s = 0; s < p; ++s) {
    bool same = timelines[s].size() == schedule.stage[s].size();
    for (size_t i = 0; same && i < timelines[s].size(); ++i) same = timelines[s][i].instruction == schedule.stage[s][i];
    if (!same)
      throw std::invalid_argument("pipeline: stage " + std::to_string(s) + "'s timeline is not its list in schedule \"" +
                                  schedule.name + "\" (" + std::to_string(timelines[s].size()) + " instructions against " +
                                  std::to_string(schedule.stage[s].size()) + ")");
  }
}

// Per stage, per instruction: when the send a cross-stage receive matches began; NaN for the other
// instructions (and for V's turn, handed over in-process).
std::vector<std::vector<double>> send_began(const Schedule& schedule,
                                            const std::vector<std::vector<TimedInstruction>>& timelines) {
  const ChunkLayout layout = schedule.layout();
  std::map<SendKey, double> sent;
  for (int s = 0; s < schedule.stages; ++s)
    for (const TimedInstruction& t : timelines[s]) {
      const Instruction& ins = t.instruction;
      if (ins.op == Op::SendActivation || ins.op == Op::SendGrad) sent[{s, ins.op, ins.micro_batch, ins.chunk}] = t.start;
    }
  std::vector<std::vector<double>> began(schedule.stages);
  for (int s = 0; s < schedule.stages; ++s)
    for (const TimedInstruction& t : timelines[s]) {
      const bool receive = t.instruction.op == Op::RecvActivation || t.instruction.op == Op::RecvGrad;
      const SendKey from = receive ? matching_send(layout, t.instruction, s) : SendKey{};
      const auto it = receive && from.stage != s ? sent.find(from) : sent.end();
      began[s].push_back(it == sent.end() ? std::numeric_limits<double>::quiet_NaN() : it->second);
    }
  return began;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  auto middle = values.begin() + values.size() / 2;
  std::nth_element(values.begin(), middle, values.end());
  return std::max(0.0, *middle);
}

}  // namespace

MeasuredCosts measured_costs(const Schedule& schedule, const std::vector<std::vector<TimedInstruction>>& timelines) {
  check_timelines(schedule, timelines);
  const int p = schedule.stages, m = schedule.micro_batches;
  const ChunkLayout layout = schedule.layout();
  const int v = schedule.chunks;
  MeasuredCosts measured;
  Costs& costs = measured.costs;
  costs.chunks.assign(p, std::vector<ChunkCosts>(v));  // sums here, means below
  double forward = 0, backward = 0, split_b = 0, split_w = 0, load = 0, step = 0;
  int loads = 0, steps = 0;
  double reduce = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> posting(p);  // per stage: what its cross-stage sends took it
  for (int s = 0; s < p; ++s)
    for (const TimedInstruction& t : timelines[s]) {
      const Instruction& ins = t.instruction;
      const double spent = t.end - t.start;
      switch (ins.op) {
        case Op::Forward:
          forward += spent;
          costs.chunks[s][ins.chunk].forward += spent / m;
          break;
        case Op::Backward:
        case Op::BackwardWeight:
          backward += spent;
          (ins.op == Op::Backward ? costs.chunks[s][ins.chunk].backward : costs.chunks[s][ins.chunk].weight) += spent / m;
          if (schedule.split_backward && !layout.first(s, ins.chunk)) (ins.op == Op::Backward ? split_b : split_w) += spent;
          break;
        case Op::LoadMicroBatch: load += spent, ++loads; break;
        case Op::OptimizerStep: step += spent, ++steps; break;
        case Op::ReduceTiedGrads: reduce = std::min(reduce, spent); break;
        case Op::SendActivation:
        case Op::SendGrad: {
          // V's turn hands over in-process (its receive may start the moment its send does): no transfer.
          const int to = ins.op == Op::SendActivation ? layout.next_stage(s, ins.chunk) : layout.previous_stage(s, ins.chunk);
          if (to != s) posting[s].push_back(spent);
          break;
        }
        case Op::RecvActivation:
        case Op::RecvGrad: break;
      }
    }
  // The latency from the receives posted before their send; then each stage's receive cost from
  // those posted after their data had arrived (a latency after the send began).
  const std::vector<std::vector<double>> began = send_began(schedule, timelines);
  std::vector<double> latencies;
  std::vector<std::vector<std::pair<double, double>>> late(p);  // per stage: (posted after the send by, took)
  for (int s = 0; s < p; ++s)
    for (size_t i = 0; i < timelines[s].size(); ++i) {
      const TimedInstruction& t = timelines[s][i];
      if (std::isnan(began[s][i])) continue;
      if (t.start <= began[s][i]) latencies.push_back(t.end - began[s][i]);
      else late[s].push_back({t.start - began[s][i], t.end - t.start});
    }
  costs.send = median(latencies);
  for (const std::vector<double>& took : posting) costs.posting.push_back(median(took));
  costs.receive.assign(p, 0.0);
  for (int s = 0; s < p; ++s) {
    std::vector<double> took;
    for (const auto& [after, spent] : late[s])
      if (after >= costs.send) took.push_back(spent);
    costs.receive[s] = median(took);
  }
  costs.forward = forward / (p * m);
  costs.backward = backward / (p * m);
  if (split_b + split_w > 0) costs.weight_share = split_w / (split_b + split_w);
  measured.timed_transfers = static_cast<int>(latencies.size());
  costs.load = loads ? load / loads : 0.0;
  costs.optimizer_step = steps ? step / steps : 0.0;
  costs.reduce_tied = reduce == std::numeric_limits<double>::infinity() ? 0.0 : reduce;
  return measured;
}

std::vector<double> measured_idle(const std::vector<std::vector<TimedInstruction>>& timelines) {
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const std::vector<TimedInstruction>& timeline : timelines)
    if (!timeline.empty()) first = std::min(first, timeline.front().start), last = std::max(last, timeline.back().end);
  std::vector<double> idle;
  for (const std::vector<TimedInstruction>& timeline : timelines) {
    double busy = 0;
    for (const TimedInstruction& t : timeline)
      if (t.instruction.op == Op::Forward || t.instruction.op == Op::Backward || t.instruction.op == Op::BackwardWeight)
        busy += t.end - t.start;
    idle.push_back(last > first ? 1.0 - busy / (last - first) : 0.0);
  }
  return idle;
}

std::vector<std::vector<double>> own_costs(const Schedule& schedule, const MeasuredCosts& measured,
                                           const std::vector<std::vector<TimedInstruction>>& timelines) {
  check_timelines(schedule, timelines);
  const std::vector<std::vector<double>> began = send_began(schedule, timelines);
  const Costs& costs = measured.costs;
  std::vector<std::vector<double>> own(schedule.stages);
  for (int s = 0; s < schedule.stages; ++s)
    for (size_t i = 0; i < timelines[s].size(); ++i) {
      const TimedInstruction& t = timelines[s][i];
      const bool receive = t.instruction.op == Op::RecvActivation || t.instruction.op == Op::RecvGrad;
      if (!receive) own[s].push_back(t.end - t.start);
      else if (std::isnan(began[s][i])) own[s].push_back(0.0);  // V's turn: in-process
      else if (t.start - began[s][i] >= costs.send) own[s].push_back(t.end - t.start);  // its data was there
      else own[s].push_back(costs.receive.empty() ? 0.0 : costs.receive[s]);
    }
  return own;
}

ExpectedIdle expected_idle(const Schedule& schedule, const MeasuredCosts& measured,
                           const std::vector<std::vector<TimedInstruction>>& timelines, int draws, unsigned seed) {
  if (draws < 1) throw std::invalid_argument("pipeline: expected_idle needs at least one draw, got " + std::to_string(draws));
  const std::vector<std::vector<double>> own = own_costs(schedule, measured, timelines);
  const int p = schedule.stages;
  // Per stage, each kind's own costs in the measured batch: (op, chunk) -> what its instructions took;
  // and per instruction the pool it draws from.
  std::vector<std::map<std::pair<Op, int>, std::vector<double>>> took(p);
  for (int s = 0; s < p; ++s)
    for (size_t i = 0; i < own[s].size(); ++i) took[s][{schedule.stage[s][i].op, schedule.stage[s][i].chunk}].push_back(own[s][i]);
  std::vector<std::vector<const std::vector<double>*>> pool(p);
  for (int s = 0; s < p; ++s)
    for (const Instruction& ins : schedule.stage[s]) pool[s].push_back(&took[s][{ins.op, ins.chunk}]);
  ExpectedIdle expected;
  Costs costs = measured.costs;
  costs.own = own;
  expected.replayed = simulate(schedule, costs).idle_fraction;
  std::mt19937 random(seed);
  std::vector<std::vector<double>> idle(p);
  for (int draw = 0; draw < draws; ++draw) {
    for (int s = 0; s < p; ++s)
      for (size_t i = 0; i < pool[s].size(); ++i) {
        const std::vector<double>& kind = *pool[s][i];
        costs.own[s][i] = kind[std::uniform_int_distribution<size_t>(0, kind.size() - 1)(random)];
      }
    const Simulation sim = simulate(schedule, costs);
    for (int s = 0; s < p; ++s) idle[s].push_back(sim.idle_fraction[s]);
  }
  for (std::vector<double>& fractions : idle) {
    std::sort(fractions.begin(), fractions.end());
    double sum = 0;
    for (double f : fractions) sum += f;
    expected.mean.push_back(sum / draws);
    expected.low.push_back(fractions[(draws - 1) / 10]);
    expected.high.push_back(fractions[(draws - 1) - (draws - 1) / 10]);
  }
  return expected;
}

}  // namespace tessera::pipeline
