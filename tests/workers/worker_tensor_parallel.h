// The tensor-parallel scenario of tessera_test_worker (worker_tensor_parallel.cpp).
#pragma once

namespace tessera {
class ParallelContext;
}

// The regions (parallel/tensor_parallel/regions.h) and layers (layers.h, cross_entropy.h) on every
// rank of the tensor group against the same computation done whole in this process; throws on a
// difference, prints "tensor parallel ok on rank R of T" at the end.
void check_tensor_parallel(tessera::ParallelContext& ctx);
