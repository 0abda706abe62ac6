// Bus bandwidth of allreduce, reduce-scatter and allgather over tessera's Communicator, 1 MB to
// 256 MB of fp32. Run on N ranks through the launcher (bench/run_collectives.sh runs it together
// with the torch.distributed baseline and prints the ratio). Rank 0 prints one JSON object a line.
//
// Bus bandwidth as in nccl-tests: allreduce moves 2(n-1)/n of the buffer per rank, reduce-scatter
// and allgather (n-1)/n, so figures are comparable across collectives and rank counts.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>

#include "parallel/parallel_context.h"

using namespace tessera;

namespace {

double time_it(Communicator& c, int iterations, const std::function<void()>& op) {
  op();  // warm-up: connections, allocations
  c.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) op();
  c.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  // bench_collectives [MAX_MB] [alltoall|pairwise|native]: the reduce-scatter at every size as
  // Gloo's all-to-all, as direct sends and receives (the engine's default on Gloo:
  // parallel/communicator.h), or as Gloo's own.
  int64_t max_mb = argc > 1 ? std::atoll(argv[1]) : 256;
  const std::string mode = argc > 2 ? argv[2] : "";
  ParallelOptions options;
  options.backend = "gloo";
  if (mode == "alltoall" || mode == "pairwise") {
    options.communicator.alltoall_reduce_scatter_max_bytes = std::numeric_limits<int64_t>::max();
    options.communicator.pairwise_reduce_scatter = mode == "pairwise";
  } else if (mode == "native") {
    options.communicator.alltoall_reduce_scatter_max_bytes = 0;
  }
  const std::string impl = mode.empty() ? "tessera" : "tessera-" + mode + "-rs";
  auto ctx = ParallelContext::from_environment(options);
  Communicator& world = ctx->world();
  const int n = world.size();
  for (int64_t mb = 1; mb <= max_mb; mb *= 4) {
    const int64_t bytes = mb << 20, elements = bytes / 4;
    const int iterations = mb <= 4 ? 20 : mb <= 64 ? 5 : 2;
    at::Tensor full = at::ones({elements}, at::kFloat), slice = at::ones({elements / n}, at::kFloat);
    struct Case {
      const char* name;
      double factor;
      std::function<void()> op;
    };
    Case cases[] = {
        {"allreduce", 2.0 * (n - 1) / n, [&] { world.all_reduce(full); }},
        {"reduce_scatter", double(n - 1) / n, [&] { world.reduce_scatter(full, slice); }},
        {"allgather", double(n - 1) / n, [&] { world.all_gather(slice, full); }},
    };
    for (auto& c : cases) {
      double seconds = time_it(world, iterations, c.op);
      if (ctx->rank() == 0)
        std::printf("{\"impl\": \"%s\", \"collective\": \"%s\", \"ranks\": %d, \"bytes\": %lld, "
                    "\"seconds\": %.6f, \"busbw_gbps\": %.3f}\n",
                    impl.c_str(), c.name, n, (long long)bytes, seconds,
                    bytes * c.factor / seconds / 1e9);
    }
    std::fflush(stdout);
  }
  return 0;
}
