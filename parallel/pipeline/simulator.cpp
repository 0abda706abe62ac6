#include "parallel/pipeline/simulator.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <stdexcept>
#include <utility>

namespace tessera::pipeline {

namespace {

bool per_micro_batch(Op op) { return op != Op::ReduceTiedGrads && op != Op::OptimizerStep; }

// Where each (op, micro-batch, chunk) sits in a stage's list; -1 when absent.
struct Positions {
  std::map<std::tuple<Op, int, int>, std::vector<int>> at;
  int first(Op op, int mb, int chunk = 0) const {
    auto it = at.find({op, mb, chunk});
    return it == at.end() || it->second.empty() ? -1 : it->second.front();
  }
  int count(Op op, int mb, int chunk = 0) const {
    auto it = at.find({op, mb, chunk});
    return it == at.end() ? 0 : static_cast<int>(it->second.size());
  }
};

}  // namespace

std::vector<std::string> check(const Schedule& schedule) {
  std::vector<std::string> errors;
  const int p = schedule.stages, m = schedule.micro_batches, v = schedule.chunks;
  if (static_cast<int>(schedule.stage.size()) != p) {
    errors.push_back("the schedule has " + std::to_string(schedule.stage.size()) + " stage lists for " + std::to_string(p) +
                     " stages");
    return errors;
  }
  for (int s = 0; s < p; ++s) {
    const std::vector<Instruction>& program = schedule.stage[s];
    const std::string where = "stage " + std::to_string(s) + ": ";
    Positions pos;
    for (int i = 0; i < static_cast<int>(program.size()); ++i) {
      const Instruction& ins = program[i];
      if (per_micro_batch(ins.op) && (ins.micro_batch < 0 || ins.micro_batch >= m))
        errors.push_back(where + to_string(ins) + " names a micro-batch outside 0.." + std::to_string(m - 1));
      if (ins.chunk < 0 || ins.chunk >= v)
        errors.push_back(where + to_string(ins) + " names a model chunk outside 0.." + std::to_string(v - 1));
      pos.at[{ins.op, ins.micro_batch, ins.chunk}].push_back(i);
    }
    const ChunkLayout layout = schedule.layout();
    for (int c = 0; c < v; ++c) {
    // The model's first and last chunks are the pipeline's ends.
    const bool first = layout.first(s, c), last = layout.last(s, c);
    // What this stage's position needs for each micro-batch: (op, needed?), in the order they must run.
    const std::vector<std::pair<Op, bool>> forward_side{
        {Op::LoadMicroBatch, layout.loads(s, c)}, {Op::RecvActivation, !first}, {Op::Forward, true}, {Op::SendActivation, !last}};
    const bool t = schedule.training;  // forward-only schedules have no backward side
    const std::vector<std::pair<Op, bool>> backward_side{
        {Op::RecvGrad, t && !last}, {Op::Backward, t}, {Op::SendGrad, t && !first}};
    const std::vector<std::pair<Op, bool>> weight_side{{Op::Backward, t}, {Op::BackwardWeight, t && schedule.split_backward}};
    for (int mb = 0; mb < m; ++mb) {
      for (const auto* side : {&forward_side, &backward_side, &weight_side})
        for (const auto& [op, needed] : *side) {
          if (side == &weight_side && op == Op::Backward) continue;  // counted with the backward side
          const int n = pos.count(op, mb, c);
          if (n != (needed ? 1 : 0))
            errors.push_back(where + to_string({op, mb, c}) +
                             (needed ? " must appear once" : " has no peer at this end of the pipeline") + ", found " +
                             std::to_string(n));
        }
      auto in_order = [&](const std::vector<std::pair<Op, bool>>& ops) {
        int previous = -1;
        Op previous_op = Op::LoadMicroBatch;
        for (const auto& [op, needed] : ops) {
          const int at = needed ? pos.first(op, mb, c) : -1;
          if (at < 0) continue;
          if (at < previous)
            errors.push_back(where + to_string({op, mb, c}) + " comes before " + to_string({previous_op, mb, c}));
          previous = at;
          previous_op = op;
        }
      };
      in_order(forward_side);
      in_order(backward_side);
      in_order(weight_side);
      const int f = pos.first(Op::Forward, mb, c), b = pos.first(Op::Backward, mb, c);
      if (f >= 0 && b >= 0 && b < f) errors.push_back(where + to_string({Op::Backward, mb, c}) + " comes before its forward");
    }
    }  // chunks
    const int n = static_cast<int>(program.size());
    if (!schedule.training) {
      if (pos.count(Op::ReduceTiedGrads, -1) || pos.count(Op::OptimizerStep, -1))
        errors.push_back(where + "a forward-only schedule has no ReduceTiedGrads or OptimizerStep");
    } else if (n < 2 || !(program[n - 2] == Instruction{Op::ReduceTiedGrads}) || !(program[n - 1] == Instruction{Op::OptimizerStep}) ||
        pos.count(Op::ReduceTiedGrads, -1) != 1 || pos.count(Op::OptimizerStep, -1) != 1)
      errors.push_back(where + "must end with ReduceTiedGrads then OptimizerStep, each once");
  }
  return errors;
}

// The transport (p2p.h) matches each stream of tensors between two stages in order: the order in
// which a stage sends on a stream must be the order in which its peer receives. Per (sender,
// receiver, activations or gradients): the (micro-batch, receiving chunk) sequence both ways.
std::vector<std::string> stream_order_errors(const Schedule& schedule) {
  const int p = schedule.stages;
  const ChunkLayout layout = schedule.layout();
  using Stream = std::tuple<int, int, bool>;  // (from, to, gradient)
  std::map<Stream, std::vector<std::pair<int, int>>> sends, receives;
  for (int s = 0; s < p; ++s)
    for (const Instruction& ins : schedule.stage[s]) {
      const int mb = ins.micro_batch, c = ins.chunk, g = layout.model_chunk(s, c);
      switch (ins.op) {  // the peer and the receiving chunk (across the loop's wrap-around, or V's turn)
        case Op::SendActivation: {
          const auto [to, chunk] = layout.place(g + 1);
          sends[{s, to, false}].push_back({mb, chunk});
          break;
        }
        case Op::SendGrad: {
          const auto [to, chunk] = layout.place(g - 1);
          sends[{s, to, true}].push_back({mb, chunk});
          break;
        }
        case Op::RecvActivation: receives[{layout.previous_stage(s, c), s, false}].push_back({mb, c}); break;
        case Op::RecvGrad: receives[{layout.next_stage(s, c), s, true}].push_back({mb, c}); break;
        default: break;
      }
    }
  std::vector<std::string> errors;
  for (const auto& [stream, sent] : sends) {
    const auto& [from, to, gradient] = stream;
    if (receives[stream] != sent)
      errors.push_back("stage " + std::to_string(from) + " sends its " + (gradient ? "gradients" : "activations") +
                       " to stage " + std::to_string(to) + " in another order than stage " + std::to_string(to) +
                       " receives them (the transport matches a stream in order)");
  }
  return errors;
}

bool SendKey::operator<(const SendKey& o) const {
  return std::tie(stage, op, micro_batch, chunk) < std::tie(o.stage, o.op, o.micro_batch, o.chunk);
}

SendKey matching_send(const ChunkLayout& layout, const Instruction& receive, int s) {
  const bool activation = receive.op == Op::RecvActivation;
  const auto [from, chunk] = layout.place(layout.model_chunk(s, receive.chunk) + (activation ? -1 : 1));
  return {from, activation ? Op::SendActivation : Op::SendGrad, receive.micro_batch, chunk};
}

Simulation simulate(const Schedule& schedule, const Costs& costs) {
  std::vector<std::string> errors = check(schedule);
  if (errors.empty()) errors = stream_order_errors(schedule);
  if (!errors.empty()) {
    std::string text = "pipeline schedule \"" + schedule.name + "\" is malformed:";
    for (const std::string& e : errors) text += "\n  " + e;
    throw std::invalid_argument(text);
  }
  const int p = schedule.stages;
  Simulation sim;
  sim.busy.assign(p, 0.0);
  sim.peak_activations.assign(p, 0);
  sim.timeline.assign(p, {});
  std::vector<double> clock(p, 0.0);
  std::vector<size_t> pc(p, 0);
  std::vector<int> held(p, 0);
  // When each message can be received: (from stage, op it answers, micro-batch, chunk) -> time.
  std::map<SendKey, double> sent;
  const int v = schedule.chunks;
  const ChunkLayout layout = schedule.layout();
  // A chunk's share; a split backward's B and W.
  const double weight_cost = schedule.split_backward ? costs.backward * costs.weight_share / v : 0.0;
  const ChunkCosts uniform{costs.forward / v, costs.backward / v - weight_cost, weight_cost};
  if (!costs.receive.empty() && static_cast<int>(costs.receive.size()) != p)
    throw std::invalid_argument("pipeline simulator: receive costs for " + std::to_string(costs.receive.size()) +
                                " stages, the schedule has " + std::to_string(p));
  if (!costs.chunks.empty() && (static_cast<int>(costs.chunks.size()) != p ||
                                std::any_of(costs.chunks.begin(), costs.chunks.end(),
                                            [&](const std::vector<ChunkCosts>& c) { return static_cast<int>(c.size()) != v; })))
    throw std::invalid_argument("pipeline simulator: per-chunk costs for " + std::to_string(costs.chunks.size()) +
                                " stages, the schedule has " + std::to_string(p) + " stages of " + std::to_string(v) + " chunks");
  if (!costs.posting.empty() && static_cast<int>(costs.posting.size()) != p)
    throw std::invalid_argument("pipeline simulator: posting costs for " + std::to_string(costs.posting.size()) +
                                " stages, the schedule has " + std::to_string(p));
  if (!costs.own.empty()) {
    bool fits = static_cast<int>(costs.own.size()) == p;
    for (int s = 0; fits && s < p; ++s) fits = costs.own[s].size() == schedule.stage[s].size();
    if (!fits)
      throw std::invalid_argument("pipeline simulator: each instruction's own cost must be given for every stage's list "
                                  "of schedule \"" + schedule.name + "\" (" + std::to_string(costs.own.size()) + " lists for " +
                                  std::to_string(p) + " stages, or a list of another length)");
  }
  // What stage s's next instruction takes of itself: its own measured cost when given.
  auto own_or = [&](int s, double modelled) { return costs.own.empty() ? modelled : costs.own[s][pc[s]]; };
  // The model's first chunk sends no input gradient: the executor runs its whole backward at W.
  auto chunk_costs = [&](int s, int chunk) {
    if (!costs.chunks.empty()) return costs.chunks[s][chunk];
    if (schedule.split_backward && layout.first(s, chunk)) return ChunkCosts{uniform.forward, 0.0, uniform.backward + uniform.weight};
    return uniform;
  };

  auto record = [&](int s, const Instruction& ins, double start, double end) {
    sim.timeline[s].push_back({ins, start, end});
    clock[s] = end;
    ++pc[s];
  };
  // Runs stage s's next instruction if it can; false when it must wait.
  auto step = [&](int s) {
    const Instruction& ins = schedule.stage[s][pc[s]];
    const double now = clock[s];
    switch (ins.op) {
      case Op::LoadMicroBatch: record(s, ins, now, now + own_or(s, costs.load)); return true;
      case Op::Forward: {
        held[s] += 1;
        sim.peak_activations[s] = std::max(sim.peak_activations[s], held[s]);
        if (!schedule.training && layout.last(s, ins.chunk)) held[s] -= 1;
        const double cost = own_or(s, chunk_costs(s, ins.chunk).forward);
        sim.busy[s] += cost;
        record(s, ins, now, now + cost);
        return true;
      }
      case Op::Backward:
      case Op::BackwardWeight: {
        // Activations are held until the last part of the backward that reads them.
        const bool frees = schedule.split_backward == (ins.op == Op::BackwardWeight);
        const double cost =
            own_or(s, ins.op == Op::Backward ? chunk_costs(s, ins.chunk).backward : chunk_costs(s, ins.chunk).weight);
        if (frees) held[s] -= 1;
        sim.busy[s] += cost;
        record(s, ins, now, now + cost);
        return true;
      }
      case Op::SendActivation:
      case Op::SendGrad: {
        if (!schedule.training && ins.op == Op::SendActivation) held[s] -= 1;  // nothing kept for a backward
        // V's turn hands over in-process: no link to cross.
        const int to = ins.op == Op::SendActivation ? layout.next_stage(s, ins.chunk) : layout.previous_stage(s, ins.chunk);
        const double posting = own_or(s, to == s || costs.posting.empty() ? 0.0 : costs.posting[s]);
        sent[{s, ins.op, ins.micro_batch, ins.chunk}] = now + (to == s ? 0.0 : costs.send);
        record(s, ins, now, now + posting);
        return true;
      }
      case Op::RecvActivation:
      case Op::RecvGrad: {
        const SendKey from = matching_send(layout, ins, s);
        auto it = sent.find(from);
        if (it == sent.end()) return false;
        const double receive = from.stage == s ? 0.0 : own_or(s, costs.receive.empty() ? 0.0 : costs.receive[s]);
        record(s, ins, now, std::max(now + receive, it->second));
        sent.erase(it);
        return true;
      }
      case Op::ReduceTiedGrads: {  // a collective: every stage must be here
        for (int other = 0; other < p; ++other)
          if (pc[other] >= schedule.stage[other].size() || schedule.stage[other][pc[other]].op != Op::ReduceTiedGrads)
            return false;
        const double start = *std::max_element(clock.begin(), clock.end());
        for (int other = 0; other < p; ++other) record(other, schedule.stage[other][pc[other]], start, start + costs.reduce_tied);
        return true;
      }
      case Op::OptimizerStep: record(s, ins, now, now + own_or(s, costs.optimizer_step)); return true;
    }
    return false;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      while (pc[s] < schedule.stage[s].size() && step(s)) progress = true;
  }
  std::string blocked;
  for (int s = 0; s < p; ++s)
    if (pc[s] < schedule.stage[s].size())
      blocked += "\n  stage " + std::to_string(s) + " waits at instruction " + std::to_string(pc[s]) + ", " +
                 to_string(schedule.stage[s][pc[s]]);
  if (!blocked.empty()) throw std::runtime_error("pipeline schedule \"" + schedule.name + "\" deadlocks:" + blocked);

  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < p; ++s) sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - sim.busy[s] / sim.makespan : 0.0);
  return sim;
}

}  // namespace tessera::pipeline
