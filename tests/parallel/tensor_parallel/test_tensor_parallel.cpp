// The tensor-parallel regions and layers (parallel/tensor_parallel/) on 2 and 4 real ranks against
// the whole computation in one process (tests/workers/worker_tensor_parallel.cpp): each crossing's
// forward and backward collective, Megatron's column + row parallel MLP with and without sequence
// parallelism (outputs and every gradient), the vocabulary-parallel embedding and cross entropy.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tests/subprocess.h"

using tessera::testing::contains;

TEST_CASE("tensor parallel regions and layers on 2 and 4 ranks equal the whole computation") {
  for (int ranks : {2, 4}) {
    std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                     "--master-port", std::to_string(tessera::testing::free_port()),
                                     "--timeout", "60", "--", TESSERA_WORKER_PATH, "tensor-parallel",
                                     "--tp", std::to_string(ranks)};
    auto out = tessera::testing::run(argv, {}, 120);
    INFO(out.output);
    REQUIRE(out.status == 0);
    for (int rank = 0; rank < ranks; ++rank)
      CHECK(contains(out.output, "tensor parallel ok on rank " + std::to_string(rank) + " of " + std::to_string(ranks)));
  }
}
