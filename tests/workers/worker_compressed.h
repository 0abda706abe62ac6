// The compressed-allreduce scenario of tessera_test_worker (worker_compressed.cpp).
#pragma once

namespace tessera {
class ParallelContext;
}

// parallel/compressed_allreduce.h on every rank against a plain simulation of all ranks; throws on
// a difference, prints "compressed allreduce ok on rank R: n N, ..." per length.
void check_compressed_allreduce(tessera::ParallelContext& ctx);
