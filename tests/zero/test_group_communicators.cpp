// Parameter groups on communicators of their own (ParamGroup::communicator, zero/zero_group.h):
// a dense group over the data group, expert-like parameters over a 2-rank factor of it, and a head
// over the product of both factors, on 4 ranks at ZeRO 0-3 with accumulation and clipping under
// plain SGD, against the single-process reference of tests/workers/group_communicators_worker.cpp
// (losses, per-step gradient norm, parameters; each group's bytes on its own communicator).
#include <catch2/catch.hpp>

#include "tests/subprocess.h"
#include "zero/buffer_plan.h"

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

TEST_CASE("The buffer planner lays out each group over its own communicator's ranks") {
  tessera::BufferPlanInput in;
  in.stage = 2;
  in.data_parallel = 4;
  in.group_numels = {{1000, 24}, {1000, 24}, {1000, 24}};
  in.group_partitions = {4, 2, 1};  // the data group, a 2-rank factor of it, a one-rank group
  in.bucket_numel = 600;
  const tessera::BufferPlan plan = tessera::plan_buffers(in);
  REQUIRE(plan.groups.size() == 3);
  for (size_t g = 0; g < 3; ++g) {
    INFO("group " << g);
    const int ranks = in.group_partitions[g];
    CHECK(plan.groups[g].layout.partitions == ranks);
    CHECK(plan.groups[g].layout.shard_numel * ranks == plan.groups[g].layout.total);
    CHECK(plan.groups[g].grad_numel == plan.groups[g].layout.shard_numel);  // stage 2: the shard
    CHECK(plan.groups[g].state_numel == 2 * plan.groups[g].layout.shard_numel);
  }
  // Fewer ranks, a larger shard: the 2-rank group holds twice the data group's gradients and state.
  CHECK(plan.groups[1].layout.shard_numel >= 2 * (1024 / 4));
  CHECK(plan.groups[2].layout.shard_numel >= 1024);
  // At stage 0 nothing is partitioned, whatever the group's ranks.
  in.stage = 0;
  for (const auto& g : tessera::plan_buffers(in).groups) CHECK(g.layout.partitions == 1);
  in.stage = 2;
  in.group_partitions = {4, 0, 1};
  CHECK_THROWS_WITH(tessera::plan_buffers(in), Catch::Contains("partitioned over 0 ranks"));
}
