// A pipeline schedule timed on nodes whose ranks may outnumber their cores (CPU ranks): at every
// moment the busy ranks of a node share its cores evenly (the kernel's fair share), so a stage
// waiting in a bubble leaves its core to the stages that work, and a stage whose ranks sit on a
// crowded node runs slower than one alone on its node. With a core per rank it is the plain
// simulator's makespan (parallel/pipeline/simulator.h, which checks the schedule first).
//
// Ranks are laid out as the grid lays them out (parallel/topology.h: pipe outermost), so stage s
// is ranks [s·k, (s+1)·k) for k = dp·cp·tp, and node n ranks [n·r, (n+1)·r): the stage's ranks
// move in lockstep (they meet in collectives), at the pace of its most crowded node.
#pragma once

#include "parallel/pipeline/schedule.h"

namespace tessera::planner {

struct SharedCores {
  int ranks_per_stage = 1;  // dp · cp · tp
  int ranks_per_node = 1;
  int cores_per_node = 1;   // <= 0: a core (device) per rank
};

// One micro-batch through one stage: `work` seconds of computing with a core to itself, then
// `wait` seconds the core-sharing does not stretch (its collectives on the wire).
struct StageOpCost {
  double work = 0, wait = 0;
};

// The makespan of `schedule` (Forward and Backward only; the rest free), each send arriving `send`
// seconds after it is posted. Throws std::invalid_argument for a malformed schedule.
double shared_core_makespan(const pipeline::Schedule& schedule, StageOpCost forward, StageOpCost backward, double send,
                            const SharedCores& cores);

}  // namespace tessera::planner
