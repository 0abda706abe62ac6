#include "engine/planner/shared_cores.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

#include "parallel/pipeline/simulator.h"

namespace tessera::planner {

using pipeline::Instruction;
using pipeline::Op;

double shared_core_makespan(const pipeline::Schedule& schedule, StageOpCost forward, StageOpCost backward, double send,
                            const SharedCores& cores) {
  const std::vector<std::string> errors = pipeline::check(schedule);
  if (!errors.empty()) throw std::invalid_argument("pipeline schedule \"" + schedule.name + "\" is malformed: " + errors[0]);
  const int p = schedule.stages, v = schedule.chunks;
  const int k = std::max(1, cores.ranks_per_stage), r = std::max(1, cores.ranks_per_node);
  const int nodes = (p * k + r - 1) / r;
  // ranks[n][s]: how many of stage s's ranks node n holds.
  std::vector<std::vector<int>> ranks(nodes, std::vector<int>(p, 0));
  for (int rank = 0; rank < p * k; ++rank) ++ranks[rank / r][rank / k];

  // A chunk's share of a micro-batch's forward and backward; a split backward's B and W halves,
  // but the model's first chunk, which sends no input gradient, runs its whole backward at W (the
  // executor's way, as the simulator times it).
  const pipeline::ChunkLayout layout = schedule.layout();
  auto cost_of = [&](int s, const Instruction& ins) {
    const StageOpCost& c = ins.op == Op::Forward ? forward : backward;
    double part = 1.0;
    if (ins.op != Op::Forward && schedule.split_backward)
      part = !layout.first(s, ins.chunk) ? 0.5 : ins.op == Op::Backward ? 0.0 : 1.0;
    return StageOpCost{c.work * part / v, c.wait * part / v};
  };

  struct Stage {
    size_t pc = 0;
    bool running = false;
    double work = 0, wait = 0;  // what is left of the running instruction
  };
  std::vector<Stage> stage(p);
  std::map<pipeline::SendKey, double> sent;  // a send -> when it arrives
  double now = 0;
  const double eps = 1e-12;

  // Runs stage s's free instructions until it computes, waits for a message, or is done. Returns
  // when a message it waits for arrives (infinity: not sent yet, or not waiting).
  auto advance = [&](int s) {
    Stage& st = stage[s];
    const auto& program = schedule.stage[s];
    while (!st.running && st.pc < program.size()) {
      const Instruction& ins = program[st.pc];
      switch (ins.op) {
        case Op::Forward:
        case Op::Backward:
        case Op::BackwardWeight: {
          const StageOpCost c = cost_of(s, ins);
          st.running = true, st.work = c.work, st.wait = c.wait;
          return std::numeric_limits<double>::infinity();
        }
        case Op::SendActivation:
        case Op::SendGrad: {  // V's turn hands over in-process: no link to cross
          const int to = ins.op == Op::SendActivation ? layout.next_stage(s, ins.chunk) : layout.previous_stage(s, ins.chunk);
          sent[{s, ins.op, ins.micro_batch, ins.chunk}] = now + (to == s ? 0.0 : send);
          break;
        }
        case Op::RecvActivation:
        case Op::RecvGrad: {
          auto it = sent.find(pipeline::matching_send(layout, ins, s));
          if (it == sent.end()) return std::numeric_limits<double>::infinity();
          if (it->second > now + eps) return it->second;
          sent.erase(it);
          break;
        }
        default: break;  // loads, the tied reduction and the step: free here
      }
      ++st.pc;
    }
    return std::numeric_limits<double>::infinity();
  };

  for (;;) {
    // Free instructions until none moves (a stage's send can free a stage advanced before it).
    double next_arrival = std::numeric_limits<double>::infinity();
    bool done = true;
    for (bool moved = true; moved;) {
      moved = false, done = true;
      next_arrival = std::numeric_limits<double>::infinity();
      for (int s = 0; s < p; ++s) {
        const size_t before = stage[s].pc;
        const bool was_running = stage[s].running;
        next_arrival = std::min(next_arrival, advance(s));
        moved = moved || stage[s].pc != before || stage[s].running != was_running;
        done = done && stage[s].pc >= schedule.stage[s].size();
      }
    }
    if (done) break;
    // Each node's busy ranks share its cores; a stage goes at the pace of its most crowded node.
    std::vector<double> speed(p, 1.0);
    if (cores.cores_per_node > 0) {
      for (int n = 0; n < nodes; ++n) {
        int busy = 0;
        for (int s = 0; s < p; ++s)
          if (stage[s].running && stage[s].work > eps) busy += ranks[n][s];
        const double node_speed = busy > cores.cores_per_node ? double(cores.cores_per_node) / busy : 1.0;
        for (int s = 0; s < p; ++s)
          if (ranks[n][s] > 0) speed[s] = std::min(speed[s], node_speed);
      }
    }
    double dt = next_arrival - now;
    for (int s = 0; s < p; ++s)
      if (stage[s].running) dt = std::min(dt, stage[s].work > eps ? stage[s].work / speed[s] : stage[s].wait);
    if (!(dt < std::numeric_limits<double>::infinity()))
      throw std::runtime_error("pipeline schedule \"" + schedule.name + "\" deadlocks");
    dt = std::max(dt, 0.0);
    for (int s = 0; s < p; ++s) {
      Stage& st = stage[s];
      if (!st.running) continue;
      if (st.work > eps) st.work -= dt * speed[s];
      else st.wait -= dt;
      if (st.work <= eps && st.wait <= eps) st.running = false, ++st.pc;
    }
    now += dt;
  }
  return now;
}

}  // namespace tessera::planner
