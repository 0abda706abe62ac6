// Parameter groups on communicators of their own (ParamGroup::communicator, zero/zero_group.h):
// a dense group over the data group, expert-like parameters over a 2-rank factor of it, and a head
// over the product of both factors, on 4 ranks at ZeRO 0-3 with accumulation and clipping under
// plain SGD, against the single-process reference of tests/workers/group_communicators_worker.cpp
// (losses, per-step gradient norm, parameters; each group's bytes on its own communicator).
#include <catch2/catch.hpp>

#include "tests/subprocess.h"

using tessera::testing::contains;

namespace {

tessera::testing::RunResult train(std::vector<std::string> args) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", "4", "--master-port",
                                   std::to_string(tessera::testing::free_port()), "--timeout", "60", "--",
                                   TESSERA_GROUP_COMMUNICATORS_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return tessera::testing::run(argv, {}, 180);
}

}  // namespace

TEST_CASE("Parameter groups over the data group, a factor of it and a product of factors match one process at every ZeRO stage") {
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    auto r = train({"--stage", std::to_string(stage)});
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "groups ok: stage " + std::to_string(stage)));
  }
}

TEST_CASE("Parameter groups on their own communicators with several buckets each") {
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    auto r = train({"--stage", std::to_string(stage), "--bucket", "96", "--steps", "2"});
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "groups ok"));
  }
}
