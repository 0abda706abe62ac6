// Collectives on 2 and 4 real processes over Gloo, started through `tessera launch`, checked
// against values computed by hand (tests/test_worker.cpp), including uneven lengths.
#include <catch2/catch.hpp>

#include "subprocess.h"

using tessera::testing::contains;

namespace {
tessera::testing::RunResult launch(int ranks, std::vector<std::string> worker_args, int port) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                   "--master-port", std::to_string(port), "--timeout", "60", "--",
                                   TESSERA_WORKER_PATH};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return tessera::testing::run(argv, {}, 120);
}
}  // namespace

TEST_CASE("collectives on 2 ranks") {
  auto r = launch(2, {"collectives"}, 29741);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "collectives ok on rank 0"));
  CHECK(contains(r.output, "collectives ok on rank 1"));
}

TEST_CASE("collectives on 4 ranks with tensor-parallel groups of 2") {
  auto r = launch(4, {"collectives", "--tp", "2"}, 29742);
  INFO(r.output);
  CHECK(r.status == 0);
  for (int rank = 0; rank < 4; ++rank) CHECK(contains(r.output, "collectives ok on rank " + std::to_string(rank)));
}

TEST_CASE("reduce-scatter built from all-to-all gives the same results (2 and 4 ranks)") {
  for (int ranks : {2, 4}) {
    auto r = launch(ranks, {"collectives", "--alltoall-reduce-scatter"}, 29743 + ranks);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "(native reduce-scatters 0, all-to-all"));
  }
}

TEST_CASE("a dead peer makes the others fail with the collective and the group named") {
  // Started directly (not through the launcher, which would stop the survivors itself).
  std::vector<tessera::testing::Started> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(tessera::testing::start({TESSERA_WORKER_PATH, "dead-peer"},
                                            {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                                             {"MASTER_PORT", "29751"}, {"TESSERA_TIMEOUT_S", "20"}}));
  auto survivor = tessera::testing::finish(ranks[0], 60);
  auto dead = tessera::testing::finish(ranks[1], 60);
  INFO(survivor.output);
  CHECK(dead.status == 3);
  CHECK(survivor.status == 1);
  CHECK(survivor.seconds < 30);
  CHECK(contains(survivor.output, "all_reduce of 1000 float elements on group 'world'"));
}
