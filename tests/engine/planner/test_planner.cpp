// The layout planner (engine/planner/): its enumeration against the estimator's own numbers and the
// engine's config rules, the step-cost model's pipeline bubble against the closed form and the
// schedule simulator, the calibration's sources and cache, the configs it writes, and the CLI.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>

#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "engine/planner/planner.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"
#include "tests/subprocess.h"

using namespace tessera;
using namespace tessera::planner;
using nlohmann::json;
using tessera::testing::contains;

namespace {

// GPT-2 medium on 8 GPUs of 6 GiB: some layouts fit, some do not.
json medium_request() {
  return {{"preset", "gpt2-medium"}, {"gpus_per_node", 8}, {"gpu_mem", 6}, {"bf16", true},
          {"global_batch", 32}, {"nvme", 1000}};
}

EstimateResult estimate_of(const PlanInputs& in, const Layout& l) {
  EstimateInputs one = in.base;
  one.search = false;
  one.setup = apply(l, in.base.setup);
  return estimate(one);
}

}  // namespace

TEST_CASE("planner: every layout proposed fits by the estimator and every one rejected for memory does not") {
  const PlanInputs in = plan_inputs_from_json(medium_request());
  const PlanResult r = plan(in);
  REQUIRE(r.ranked.size() > 10);
  int memory_rejections = 0;
  for (const auto& x : r.rejected)
    if (x.kind == "memory") {
      ++memory_rejections;
      const EstimateResult e = estimate_of(in, x.layout);
      INFO(x.layout.label());
      CHECK_FALSE(e.fits);
      CHECK(e.per_gpu.total > e.per_gpu.capacity);
      CHECK(contains(x.reason, "needed"));
    }
  CHECK(memory_rejections > 100);  // 6 GiB rules out the large micro-batches without ZeRO
  for (const auto& c : r.ranked) {
    INFO(c.layout.label());
    const EstimateResult e = estimate_of(in, c.layout);
    CHECK(e.fits);
    CHECK(e.per_gpu.total == c.per_rank_bytes);
    CHECK(c.layout.world() == 8);  // the degrees multiply to the world
    CHECK(c.layout.global_batch() == 32);
    CHECK(c.cost.total() > 0);
  }
  // Fastest first.
  for (size_t i = 1; i < r.ranked.size(); ++i) CHECK(r.ranked[i - 1].cost.total() <= r.ranked[i].cost.total() * (1 + 1e-9));
}

TEST_CASE("planner: what it proposes the engine runs - its config passes tessera config check with the same layout") {
  const PlanInputs in = plan_inputs_from_json(medium_request());
  const PlanResult r = plan(in);
  std::set<std::string> seen;
  for (const auto& c : r.ranked) {
    INFO(c.layout.label() << "\n" << c.config.dump(2));
    ConfigReport report;
    ResolvedLayout layout;
    Config config = parse_and_resolve_config(c.config, 8, report, &layout);
    add_engine_support_issues(config, report);
    REQUIRE(report.ok());
    CHECK(layout.tensor == c.layout.tp);
    CHECK(layout.pipe == c.layout.pp);
    CHECK(layout.context == c.layout.cp);
    CHECK(layout.data == c.layout.dp);
    const TrainingSetup s = setup_from_config(config);
    CHECK(s.zero_stage == c.layout.zero_stage);
    CHECK(s.offload_optimizer == c.layout.offload_optimizer);
    CHECK(s.offload_param == c.layout.offload_param);
    CHECK(s.micro_batch == c.layout.micro_batch);
    CHECK(s.gradient_accumulation == c.layout.gradient_accumulation);
    CHECK(s.activation_checkpointing == c.layout.activation_checkpointing);
    seen.insert(std::to_string(c.layout.tp) + "/" + std::to_string(c.layout.pp) + "/" + std::to_string(c.layout.cp));
  }
  CHECK(seen.size() >= 5);  // the grid is searched, not only data parallelism
  // What the engine's rules refuse is rejected as unsupported, never proposed: offload to NVMe
  // without a drive is not even tried; with one, the layouts that use it name nvme_path.
  for (const auto& c : r.ranked)
    if (c.layout.offload_optimizer == "nvme")
      CHECK(c.config["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/local_nvme");
}

TEST_CASE("planner: the shape rules out tensor and context degrees that do not divide it - fixed keys fix the choice") {
  // GPT-2 medium has 16 heads and a vocabulary of 50257 (odd): no tensor parallelism at all.
  const PlanResult r = plan(plan_inputs_from_json(medium_request()));
  bool vocab_reason = false;
  for (const auto& c : r.ranked) CHECK(c.layout.tp == 1);
  for (const auto& x : r.rejected) vocab_reason |= x.kind == "shape" && contains(x.reason, "does not divide the vocabulary of 50257");
  CHECK(vocab_reason);
  // 12 heads, vocab 256 on 8 ranks: tp 8 does not divide the heads; ulysses cp must divide heads / tp.
  json request = {{"layers", 4}, {"hidden", 96}, {"heads", 12}, {"vocab", 256}, {"seq_len", 64},
                  {"gpus_per_node", 8}, {"global_batch", 16}, {"offload", false}};
  const PlanResult small = plan(plan_inputs_from_json(request));
  bool heads_reason = false;
  for (const auto& x : small.rejected) heads_reason |= contains(x.reason, "tp 8 does not divide the 12 heads");
  CHECK(heads_reason);
  for (const auto& c : small.ranked) {
    CHECK(12 % c.layout.tp == 0);
    CHECK((12 / c.layout.tp) % c.layout.cp == 0);
    CHECK(c.layout.pp <= 4);
    CHECK(c.layout.offload_optimizer == "none");
  }
  request["tp"] = 2;
  request["zero"] = 1;
  request["micro_batch"] = 2;
  const PlanResult fixed = plan(plan_inputs_from_json(request));
  REQUIRE_FALSE(fixed.ranked.empty());
  for (const auto& c : fixed.ranked) {
    CHECK(c.layout.tp == 2);
    CHECK(c.layout.zero_stage == 1);
    CHECK(c.layout.micro_batch == 2);
  }
  // A global batch the data-parallel size does not divide rules that grid out.
  request.erase("tp"), request.erase("zero"), request.erase("micro_batch");
  request["global_batch"] = 6;
  bool batch_reason = false;
  for (const auto& x : plan(plan_inputs_from_json(request)).rejected)
    batch_reason |= x.kind == "batch" && contains(x.reason, "does not divide over dp 4");
  CHECK(batch_reason);
}

TEST_CASE("planner: the pipeline bubble is the simulator's 1F1B idle time - (p-1)/(m+p-1) of the makespan") {
  for (int p : {2, 4})
    for (int m : {1, 4, 8}) {
      pipeline::Costs costs;
      costs.forward = 1, costs.backward = 2;
      const pipeline::Simulation sim = pipeline::simulate(pipeline::one_f_one_b(p, m), costs);
      CHECK(sim.idle_fraction[0] == Approx(one_f_one_b_bubble(p, m)));
    }
  // The planner's term: 8 layers over 4 stages; sends cost nothing at this bandwidth.
  json request = {{"layers", 8}, {"hidden", 64}, {"heads", 4}, {"vocab", 64}, {"seq_len", 32}, {"gpus_per_node", 4},
                  {"global_batch", 8}, {"pp", 4}, {"tp", 1}, {"cp", 1}, {"zero", 0}, {"intra_node_bw", 1e9},
                  {"collective_latency_us", 1e-9}, {"offload", false}, {"activation_checkpointing", "none"}};
  for (int micro : {1, 2, 8}) {
    request["micro_batch"] = micro;
    const PlanResult r = plan(plan_inputs_from_json(request));
    REQUIRE(r.ranked.size() == 1);
    const StepCost& c = r.ranked[0].cost;
    const int m = int(r.ranked[0].layout.gradient_accumulation);
    INFO("micro " << micro << " m " << m);
    CHECK(m == 8 / micro);
    // Every stage timed as the busiest: makespan (m + p - 1)(f + b), the work m (f + b).
    CHECK(c.bubble == Approx(3.0 / m * c.compute).epsilon(1e-6));
    CHECK(c.bubble / (c.compute + c.bubble) == Approx(one_f_one_b_bubble(4, m)).epsilon(1e-6));
  }
}

TEST_CASE("planner: calibration says where each rate came from - given - default - measured now - cached") {
  tessera::testing::TempDir dir;
  json request = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 2}, {"global_batch", 4},
                  {"cpu_mem", 16}, {"offload", false}, {"cp_search", false}, {"intra_node_bw", 3.0},
                  {"calibration_cache", dir.file("calibration.json")}};
  // No cache, no probe: the estimator's defaults, and the rate given.
  const PlanInputs plain = plan_inputs_from_json(request);
  CHECK_FALSE(plain.calibration.probes());
  CHECK(plain.calibration.intra_node_gbps.source == "given");
  CHECK(plain.calibration.intra_node_gbps.value == 3.0);
  CHECK(contains(plain.calibration.tflops.source, "default"));
  // The probe now: compute, memory and Gloo among the 2 ranks measured; the layer shapes timed and cached.
  request["measure"] = true;
  const PlanInputs measured = plan_inputs_from_json(request);
  CHECK(measured.calibration.probes());
  CHECK(contains(measured.calibration.tflops.source, "measured now"));
  CHECK(measured.calibration.tflops.value > 0);
  CHECK(contains(measured.calibration.collective_latency_us.source, "measured now: Gloo"));
  CHECK(measured.calibration.intra_node_gbps.source == "given");  // a given rate is never replaced
  const PlanResult r = plan(measured);
  REQUIRE_FALSE(r.ranked.empty());
  CHECK(r.calibration.to_json()["shapes_timed_now"].get<int>() > 0);
  const json cache = json::parse(tessera::testing::run({"cat", dir.file("calibration.json")}).output);
  REQUIRE(cache.size() == 1);
  CHECK(cache.begin().value()["layers"].size() > 0);
  // Next time: cached, nothing timed again for the same layouts, the same prediction.
  request.erase("measure");
  const PlanInputs cached = plan_inputs_from_json(request);
  CHECK(contains(cached.calibration.tflops.source, "cached ("));
  const PlanResult again = plan(cached);
  CHECK(again.calibration.to_json()["shapes_timed_now"].get<int>() == 0);
  REQUIRE(again.ranked.size() == r.ranked.size());
  CHECK(again.ranked[0].cost.total() == Approx(r.ranked[0].cost.total()));
}

TEST_CASE("tessera plan: the ranked layouts - --json - --write-config - invalid input") {
  tessera::testing::TempDir dir;
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "gpt2-medium", "--gpus-per-node", "8",
                                  "--gpu-mem", "6", "--bf16", "--global-batch", "32", "--write-config",
                                  dir.file("best.json")},
                                 {}, 60);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "layouts considered"));
  CHECK(contains(r.output, "why the rest lost"));
  CHECK(contains(r.output, "do not fit, e.g."));
  CHECK(contains(r.output, "(default (an A100-80GB-class node))"));
  // The written config is the best layout's, and tessera config check accepts it.
  auto check = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", dir.file("best.json"), "--world-size", "8"}, {}, 60);
  INFO(check.output);
  CHECK(check.status == 0);
  auto j = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "gpt2-medium", "--gpus-per-node", "8",
                                  "--gpu-mem", "6", "--bf16", "--global-batch", "32", "--json"},
                                 {}, 60);
  REQUIRE(j.status == 0);
  const json parsed = json::parse(j.output);
  CHECK(parsed["world"] == 8);
  CHECK(parsed["ranked"].size() == parsed["feasible"].get<size_t>());
  CHECK(parsed["best"] == parsed["ranked"][0]["config"]);
  CHECK(parsed["rejected_by_kind"]["memory"].get<int>() > 0);
  auto none = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "llama-70b", "--gpus-per-node", "1",
                                     "--gpu-mem", "16", "--global-batch", "8", "--no-offload"}, {}, 60);
  CHECK(none.status == 1);
  CHECK(contains(none.output, "nothing fits"));
  auto bad = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "gpt2-medium"}, {}, 60);
  CHECK(bad.status != 0);
  CHECK(contains(bad.output, "--global-batch"));
  auto gas = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "nope", "--global-batch", "8"}, {}, 60);
  CHECK(gas.status == 2);
  CHECK(contains(gas.output, "unknown preset"));
}
