// The data-parallel engine against a single-process reference (tests/engine_worker.cpp): world
// sizes 1, 2 and 4, ZeRO 0/1/2, gradient accumulation, clipping, bf16, every optimizer, overflow
// handling, and the memory each stage keeps.
#include <catch2/catch.hpp>

#include <regex>

#include "subprocess.h"

using tessera::testing::contains;

namespace {

int next_port = 29900;

tessera::testing::RunResult train(int ranks, std::vector<std::string> args) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                   "--master-port", std::to_string(next_port++), "--timeout", "60", "--",
                                   TESSERA_ENGINE_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return tessera::testing::run(argv, {}, 180);
}

}  // namespace

TEST_CASE("fp32 ZeRO 0/1/2 on 1 - 2 and 4 ranks equal a single-process run") {
  for (int ranks : {1, 2, 4}) {
    for (int stage : {0, 1, 2}) {
      // Small buckets: several buckets per group, parameters straddling buckets and rank chunks.
      auto r = train(ranks, {"--stage", std::to_string(stage), "--mb", "2", "--steps", "4", "--bucket", "300"});
      INFO("ranks " << ranks << " stage " << stage << "\n" << r.output);
      CHECK(r.status == 0);
      CHECK(contains(r.output, "engine ok"));
    }
  }
}

TEST_CASE("gradient accumulation: mb 1 x gas 4 equals the same global batch in one micro-step") {
  for (int stage : {0, 1, 2}) {
    auto r = train(2, {"--stage", std::to_string(stage), "--mb", "1", "--gas", "4", "--steps", "3", "--bucket", "500"});
    INFO("stage " << stage << "\n" << r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "engine ok"));
  }
}

TEST_CASE("gradient clipping by the global norm across ranks") {
  for (int stage : {0, 2}) {
    auto r = train(2, {"--stage", std::to_string(stage), "--clip", "0.05", "--steps", "4"});
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "engine ok"));
  }
}

TEST_CASE("Adam with L2 decay - SGD with Nesterov momentum - and LAMB across rank boundaries") {
  for (std::string opt : {"adam", "sgd", "lamb"}) {
    for (int stage : {0, 2}) {
      auto r = train(2, {"--stage", std::to_string(stage), "--optimizer", opt, "--steps", "4", "--bucket", "300"});
      INFO(opt << " stage " << stage << "\n" << r.output);
      CHECK(r.status == 0);
      CHECK(contains(r.output, "engine ok"));
    }
  }
}

TEST_CASE("bf16 compute with fp32 master weights stays within tolerance") {
  for (int stage : {0, 1, 2}) {
    auto r = train(2, {"--stage", std::to_string(stage), "--dtype", "bf16", "--steps", "4"});
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "engine ok"));
  }
}

TEST_CASE("an inf on one rank makes every rank skip the same step and lower the fp16 scale") {
  auto r = train(2, {"--stage", "2", "--dtype", "fp16", "--steps", "4", "--inject-inf-step", "1"});
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "step 2: gradient overflow, step skipped; loss scale 256 -> 128"));
  CHECK(contains(r.output, "skipped steps 1, global steps 4, loss scale 128"));
  CHECK(contains(r.output, "engine ok"));
}

TEST_CASE("per-rank memory of each ZeRO stage matches the accounting") {
  // The MLP has 1528 parameters (Ψ); on 2 ranks with one bucket per group, padding adds < 1 element a group.
  const double psi = 1528, n = 2;
  const double expected[3] = {16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n};
  for (int stage : {0, 1, 2}) {
    auto r = train(2, {"--stage", std::to_string(stage), "--steps", "1", "--memory"});
    INFO(r.output);
    REQUIRE(r.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m, std::regex("memory: params (\\d+) master (\\d+) grads (\\d+) states (\\d+)")));
    double total = std::stod(m[1]) + std::stod(m[2]) + std::stod(m[3]) + std::stod(m[4]);
    CHECK(std::stod(m[2]) == 0);                       // fp32: no separate master copy
    CHECK(std::abs(total - expected[stage]) <= 16 * 4); // at most one padding element per group and buffer
  }
}

TEST_CASE("per-rank memory with bf16 compute: 2 bytes of parameters - fp32 master - fp32 gradient accumulation") {
  // bf16 params 2Ψ; fp32 master 4Ψ (stage 0) or 4Ψ/N; fp32 grads 4Ψ (stages 0-1) or 4Ψ/N; Adam 8Ψ or 8Ψ/N.
  const double psi = 1528, n = 2;
  const double master[3] = {4 * psi, 4 * psi / n, 4 * psi / n};
  const double grads[3] = {4 * psi, 4 * psi, 4 * psi / n};
  const double states[3] = {8 * psi, 8 * psi / n, 8 * psi / n};
  for (int stage : {0, 1, 2}) {
    auto r = train(2, {"--stage", std::to_string(stage), "--dtype", "bf16", "--steps", "1", "--memory"});
    INFO(r.output);
    REQUIRE(r.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m, std::regex("memory: params (\\d+) master (\\d+) grads (\\d+) states (\\d+)")));
    CHECK(std::abs(std::stod(m[1]) - 2 * psi) <= 2 * 2);
    CHECK(std::abs(std::stod(m[2]) - master[stage]) <= 4 * 2);
    CHECK(std::abs(std::stod(m[3]) - grads[stage]) <= 4 * 2);
    CHECK(std::abs(std::stod(m[4]) - states[stage]) <= 8 * 2);
  }
}
