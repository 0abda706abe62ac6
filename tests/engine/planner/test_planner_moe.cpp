// The layout planner on MoE models (engine/planner/): the expert degree searched where the engine
// allows it (ep divides dp and the experts, with or without context parallelism), written into the
// config it checks, the step-cost model's all-to-all and expert-group terms against their
// formulas, and moe.ep_size "auto" resolved alike by the config check and train_gpt.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <string>

#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "engine/planner/auto_layout.h"
#include "engine/planner/planner.h"
#include "tests/example_runs.h"
#include "tests/subprocess.h"

using namespace tessera;
using namespace tessera::planner;
using nlohmann::json;
using tessera::testing::contains;

namespace {

// 4 layers of 256 (blocks 1 and 3 MoE), 4 GPUs, no probe: the given rates only.
json moe_request(int experts) {
  return {{"layers", 4}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"seq_len", 64}, {"gpus_per_node", 4},
          {"gpu_mem", 80}, {"global_batch", 16}, {"offload", false}, {"moe_experts", experts}, {"moe_every", 2},
          {"moe_k", 2}, {"intra_node_bw", 2.0}, {"collective_latency_us", 10}, {"device_memory_bw", 100},
          {"calibration_cache", ""}};
}

}  // namespace

TEST_CASE("planner: an MoE model's expert degree is searched - ep divides dp and the experts - the engine checks the config") {
  const PlanResult r = plan(plan_inputs_from_json(moe_request(6)));
  REQUIRE_FALSE(r.ranked.empty());
  std::set<int> degrees, context;
  for (const auto& c : r.ranked) {
    INFO(c.layout.label() << "\n" << c.config.dump(2));
    CHECK(c.layout.dp % c.layout.ep == 0);
    CHECK(6 % c.layout.ep == 0);
    if (c.layout.ep > 1) context.insert(c.layout.cp);
    CHECK(c.config["moe"]["ep_size"] == c.layout.ep);
    CHECK(c.config["moe"]["num_experts"] == 6);
    ConfigReport report;
    Config config = parse_and_resolve_config(c.config, 4, report);
    add_engine_support_issues(config, report);
    REQUIRE(report.ok());
    REQUIRE(config.moe);
    CHECK(config.moe->ep_size == c.layout.ep);
    CHECK(setup_from_config(config).moe->ep_size == c.layout.ep);
    degrees.insert(c.layout.ep);
  }
  CHECK(degrees == std::set<int>{1, 2});  // ep 4 does not divide 6 experts; dp 4 allows 1, 2, 4
  CHECK(context == std::set<int>{1, 2});   // experts beside context parallelism (cp 2 x dp 2 x ep 2)
  bool experts_reason = false;
  for (const auto& x : r.rejected) experts_reason |= x.kind == "shape" && contains(x.reason, "ep 4 does not divide the 6 experts");
  CHECK(experts_reason);
  // "ep" fixes the choice; a dense model has none to fix.
  json fixed = moe_request(8);
  fixed["ep"] = 4;
  const PlanResult four = plan(plan_inputs_from_json(fixed));
  REQUIRE_FALSE(four.ranked.empty());
  for (const auto& c : four.ranked) CHECK(c.layout.ep == 4);
  json dense = moe_request(8);
  for (const char* key : {"moe_experts", "moe_every", "moe_k"}) dense.erase(key);
  dense["ep"] = 2;
  CHECK_THROWS_WITH(plan_inputs_from_json(dense), Catch::Contains("ep: the model has no MoE layers"));
}

TEST_CASE("planner: MoE step cost - four all-to-alls a layer over the ep ranks - the experts' collectives over dp/ep") {
  json request = moe_request(8);
  request.update({{"pp", 1}, {"tp", 1}, {"cp", 1}, {"micro_batch", 2}, {"zero", 1}, {"activation_checkpointing", "none"}});
  auto at = [&](int ep) {
    json one = request;
    one["ep"] = ep;
    const PlanResult r = plan(plan_inputs_from_json(one));
    REQUIRE(r.ranked.size() == 1);
    return r.ranked[0];
  };
  const Candidate one = at(1), two = at(2), four = at(4);
  const double m = 2, latency = 10e-6, bw = 2e9, h = 256, c = 4;  // fp32
  REQUIRE(one.layout.gradient_accumulation == 2);
  // Dispatch and combine, forward and backward: the routed rows (2 samples x 64 tokens x k 2),
  // (ep - 1)/ep of them leaving the rank, in both MoE blocks of every micro-batch.
  const double rows = 2 * 64 * 2;
  CHECK(one.cost.experts == 0.0);
  CHECK(two.cost.experts == Approx(m * 2 * 4 * (latency + 0.5 * rows * h * c / bw)));
  CHECK(four.cost.experts == Approx(m * 2 * 4 * (latency + 0.75 * rows * h * c / bw)));
  // ZeRO-1 over dp 4 for the dense parameters; an expert (c_fc and c_proj with their biases) over
  // the dp/ep ranks holding it: none at ep 4.
  const double expert = 2 * 256 * 1024 + 1024 + 256;
  auto stage1 = [&](double params, double ranks) {
    return ranks < 2 ? 0.0 : 2 * (latency + (ranks - 1) / ranks * 4 * params / bw);
  };
  const PlanInputs in = plan_inputs_from_json(request);
  for (const Candidate* x : {&one, &two, &four}) {
    INFO(x->layout.label());
    const double experts_here = 2 * (8.0 / x->layout.ep) * expert;  // 2 MoE blocks, 8/ep experts each
    EstimateInputs e = in.base;
    e.search = false;
    e.setup = apply(x->layout, in.base.setup);
    const double P = double(estimate(e).params_per_gpu);
    CHECK(x->cost.data == Approx(stage1(P - experts_here, 4) + stage1(experts_here, 4.0 / x->layout.ep)));
  }
  // Spreading the experts wider sends tokens but holds and reduces fewer of them.
  CHECK(one.cost.data > two.cost.data);
  CHECK(two.cost.data > four.cost.data);
  // The same rows through fewer, larger experts: fewer weights read (small products are memory-bound).
  CHECK(one.cost.compute > two.cost.compute);
  CHECK(two.cost.compute > four.cost.compute);
  CHECK(contains(format_plan(plan(plan_inputs_from_json(moe_request(8)))), "ep "));
}

TEST_CASE("auto layout: moe.ep_size \"auto\" - searched with the rest - config check and train_gpt resolve it alike") {
  json config = json::parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                                "zero_optimization": {"stage": 1}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                "moe": {"num_experts": 4, "every": 2, "k": 2, "ep_size": "auto"}})");
  CHECK(has_auto_layout(config));
  const json model = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"cpu_mem", 16}};
  const AutoLayout resolved = resolve_auto_layout(config, 2, model);
  INFO(resolved.line << "\n" << resolved.config.dump(2));
  CHECK(contains(resolved.line, "searched moe.ep_size"));
  const int ep = resolved.config["moe"]["ep_size"];
  CHECK((ep == 1 || ep == 2));
  CHECK(resolved.config["moe"]["num_experts"] == 4);
  CHECK(resolved.config["zero_optimization"]["stage"] == 1);  // fixed: not "auto"
  CHECK_FALSE(has_auto_layout(resolved.config));
  // The same answer from `tessera config check --plan` and from train_gpt, which then trains
  // exactly as with the value written out.
  tessera::testing::TempDir dir;
  std::ofstream(dir.file("auto.json")) << config.dump(2);
  std::ofstream(dir.file("explicit.json")) << resolved.config.dump(2);
  auto check = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", dir.file("auto.json"), "--world-size", "2",
                                      "--plan", model.dump()}, {}, 60);
  INFO(check.output);
  REQUIRE(check.status == 0);
  CHECK(contains(check.output, resolved.line));
  namespace ex = tessera::testing::examples;
  auto with_auto = ex::run_example(TESSERA_TRAIN_GPT_PATH, 2, dir.file("auto.json"), 2, tessera::testing::free_port(),
                                   {"--save-parameters", dir.file("auto.bin")});
  INFO(with_auto.output);
  REQUIRE(with_auto.status == 0);
  CHECK(contains(with_auto.output, resolved.line));
  auto written = ex::run_example(TESSERA_TRAIN_GPT_PATH, 2, dir.file("explicit.json"), 2, tessera::testing::free_port(),
                                 {"--save-parameters", dir.file("explicit.bin")});
  INFO(written.output);
  REQUIRE(written.status == 0);
  CHECK(ex::grad_norms(with_auto.output) == ex::grad_norms(written.output));
  CHECK(ex::max_difference(ex::read_parameters(dir.file("auto.bin")), ex::read_parameters(dir.file("explicit.bin"))) == 0.0);
}
