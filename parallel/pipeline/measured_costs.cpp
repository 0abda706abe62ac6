#include "parallel/pipeline/measured_costs.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace tessera::pipeline {

MeasuredCosts measured_costs(const Schedule& schedule, const std::vector<std::vector<TimedInstruction>>& timelines) {
  const int p = schedule.stages, m = schedule.micro_batches;
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
  const ChunkLayout layout = schedule.layout();
  const int v = schedule.chunks;
  MeasuredCosts measured;
  Costs& costs = measured.costs;
  costs.chunks.assign(p, std::vector<ChunkCosts>(v));  // sums here, means below
  double forward = 0, backward = 0, split_b = 0, split_w = 0, load = 0, step = 0;
  int loads = 0, steps = 0;
  double reduce = std::numeric_limits<double>::infinity();
  std::map<SendKey, double> sent;  // when each cross-stage send began
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
          if (to != s) sent[{s, ins.op, ins.micro_batch, ins.chunk}] = t.start;
          break;
        }
        case Op::RecvActivation:
        case Op::RecvGrad: break;
      }
    }
  auto median = [](std::vector<double> values) {
    if (values.empty()) return 0.0;
    auto middle = values.begin() + values.size() / 2;
    std::nth_element(values.begin(), middle, values.end());
    return std::max(0.0, *middle);
  };
  // The latency from the receives posted before their send; then each stage's receive cost from
  // those posted after their data had arrived (a latency after the send began).
  std::vector<double> latencies;
  std::vector<std::vector<std::pair<double, double>>> late(p);  // per stage: (posted after the send by, took)
  for (int s = 0; s < p; ++s)
    for (const TimedInstruction& t : timelines[s]) {
      if (t.instruction.op != Op::RecvActivation && t.instruction.op != Op::RecvGrad) continue;
      const auto it = sent.find(matching_send(layout, t.instruction, s));
      if (it == sent.end()) continue;
      if (t.start <= it->second) latencies.push_back(t.end - it->second);
      else late[s].push_back({t.start - it->second, t.end - t.start});
    }
  costs.send = median(latencies);
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

}  // namespace tessera::pipeline
