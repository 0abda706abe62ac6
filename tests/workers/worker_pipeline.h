// The pipeline scenario of tessera_test_worker (worker_pipeline.cpp).
#pragma once

#include <string>

namespace tessera {
class ParallelContext;
}

// An 8-layer tanh MLP cut over the pipe group, trained 3 SGD steps through PipelineExecutor with
// `schedule` and `micro_batches`; every rank also trains the whole model in-process on the same
// data, and checks its stage's parameters and (last stage) the losses against it. Throws on a
// difference; prints "pipeline ok on rank R" and the measured and simulated activations.
// `loss_on_first_stage`: the first stage returns a scalar, which the executor must refuse.
// `chunks` > 1 (interleaved_1f1b, zb_v): the layers cut into stages × chunks model chunks, stage s
// holding chunks s, s + p, ... (zb_v: s and 2p − 1 − s).
void check_pipeline(tessera::ParallelContext& ctx, const std::string& schedule, int micro_batches, bool dynamic_shape,
                    bool loss_on_first_stage = false, int chunks = 1);
