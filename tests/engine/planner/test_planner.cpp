// The layout planner (engine/planner/): its enumeration against the estimator's own numbers and the
// engine's config rules, the step-cost model's pipeline bubble against the closed form and the
// schedule simulator, the calibration's sources and cache, the configs it writes, and the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "engine/planner/auto_layout.h"
#include "engine/planner/planner.h"
#include "engine/planner/shared_cores.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"
#include "tests/example_runs.h"
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

TEST_CASE("planner: sequence parallelism - its activation savings estimated where tp > 1 - written where it applies - kept from the config") {
  json with_sp = medium_request();
  with_sp["sequence_parallel"] = true;
  const PlanResult plain = plan(plan_inputs_from_json(medium_request())), sp = plan(plan_inputs_from_json(with_sp));
  auto find = [](const PlanResult& r, const Layout& l) -> const Candidate* {
    for (const auto& c : r.ranked)
      if (c.layout.label() == l.label()) return &c;
    return nullptr;
  };
  int compared = 0;
  for (const auto& c : sp.ranked) {
    INFO(c.layout.label() << "\n" << c.config.dump(2));
    const bool tensor = c.layout.tp > 1;
    CHECK(c.config.contains("tensor_parallel") == tensor);
    if (tensor) CHECK(c.config["tensor_parallel"]["sequence_parallel"] == true);
    if (const Candidate* without = find(plain, c.layout)) {
      ++compared;
      if (tensor) CHECK(c.per_rank_bytes < without->per_rank_bytes);  // the norms' and dropouts' activations split over tp
      else CHECK(c.per_rank_bytes == without->per_rank_bytes);
    }
  }
  CHECK(compared > 0);
  // The key in the request's config is the model's: kept (not dropped with the tensor degree), and
  // estimated with as the request's flag is.
  json in_config = medium_request();
  in_config["config"] = {{"tensor_parallel", {{"sequence_parallel", true}}}};
  for (const auto& c : plan(plan_inputs_from_json(in_config)).ranked) {
    if (c.layout.tp > 1) CHECK(c.config["tensor_parallel"]["sequence_parallel"] == true);
    if (const Candidate* flagged = find(sp, c.layout)) CHECK(c.per_rank_bytes == flagged->per_rank_bytes);
  }
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

TEST_CASE("planner: the pipeline bubble is the simulator's idle time - 1F1B (p-1)/(m+p-1) of the makespan - ZB-H1 and interleaved less") {
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
                  {"collective_latency_us", 1e-9}, {"offload", false}, {"activation_checkpointing", "none"},
                  {"schedule", "1f1b"}};
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
  // ZB-H1 (B and W half a backward each) and interleaved 1F1B (two chunks a stage, each half the
  // stage's work) are timed by their own schedules: the simulator's idle share, below 1F1B's.
  for (const std::string schedule : {"zb_h1", "interleaved_1f1b"})
    for (int micro : {1, 2}) {
      request["schedule"] = schedule;
      request["micro_batch"] = micro;
      const PlanResult r = plan(plan_inputs_from_json(request));
      REQUIRE(r.ranked.size() == 1);
      const Layout& l = r.ranked[0].layout;
      CHECK(l.schedule == schedule);
      CHECK(l.virtual_stages == (schedule == "zb_h1" ? 1 : 2));
      CHECK(r.ranked[0].config["pipeline"]["schedule"] == schedule);
      const int m = 8 / micro;
      pipeline::Costs costs;
      costs.forward = 1, costs.backward = 2;
      const double idle =
          pipeline::simulate(pipeline::make_schedule(schedule, 4, m, l.virtual_stages), costs).idle_fraction[0];
      const StepCost& c = r.ranked[0].cost;
      INFO(schedule << " micro " << micro);
      CHECK(c.bubble / (c.compute + c.bubble) == Approx(idle).epsilon(1e-6));
      CHECK(idle < one_f_one_b_bubble(4, m));
    }
  // Searched when not fixed: the three schedules under a pipeline, none without one.
  request.erase("schedule");
  request["micro_batch"] = 1;
  std::set<std::string> schedules;
  for (const auto& c : plan(plan_inputs_from_json(request)).ranked) schedules.insert(c.layout.schedule);
  CHECK(schedules == std::set<std::string>{"1f1b", "interleaved_1f1b", "zb_h1"});
}

TEST_CASE("planner: ranks sharing cores - the pipeline timed with the busy ranks sharing them") {
  const StageOpCost f{1.0, 0.0}, b{2.0, 0.0};
  // A core per rank: the schedule simulator's makespan, with and without sends.
  for (int p : {2, 4})
    for (int m : {1, 4, 8})
      for (double send : {0.0, 0.25}) {
        pipeline::Costs costs;
        costs.forward = 1, costs.backward = 2, costs.send = send;
        const double plain = pipeline::simulate(pipeline::one_f_one_b(p, m), costs).makespan;
        INFO("p " << p << " m " << m << " send " << send);
        CHECK(shared_core_makespan(pipeline::one_f_one_b(p, m), f, b, send, {1, p, 0}) == Approx(plain));
        CHECK(shared_core_makespan(pipeline::one_f_one_b(p, m), f, b, send, {1, p, p}) == Approx(plain));
      }
  // Two stages on one core: the core never idles, so the step is all the work, 2m(f + b); the
  // plain simulator's (m + 1)(f + b) would need two cores.
  for (int m : {1, 4, 8})
    CHECK(shared_core_makespan(pipeline::one_f_one_b(2, m), f, b, 0.0, {1, 2, 1}) == Approx(2.0 * m * 3));
  // Four stages on two cores, one micro-batch: one stage busy at a time, at full speed.
  CHECK(shared_core_makespan(pipeline::one_f_one_b(4, 1), f, b, 0.0, {1, 4, 2}) == Approx(4 * 3.0));
  // Each stage's 2 ranks alone on a node of one core: every stage at half speed, always.
  {
    pipeline::Costs costs;
    costs.forward = 2, costs.backward = 4;
    const double plain = pipeline::simulate(pipeline::one_f_one_b(2, 4), costs).makespan;
    CHECK(shared_core_makespan(pipeline::one_f_one_b(2, 4), f, b, 0.0, {2, 2, 1}) == Approx(plain));
  }
  // A wait (a collective on the wire) is not stretched: one micro-batch on one core is the chain.
  CHECK(shared_core_makespan(pipeline::one_f_one_b(2, 1), {1.0, 0.5}, {2.0, 0.5}, 0.0, {1, 2, 1}) ==
        Approx(2 * (1.5 + 2.5)));
  // The planner's bubble for 4 CPU ranks on 2 cores: a stage idle in 1F1B's ramp leaves its core
  // to the others, so the bubble is less than the core-per-rank one, (p - 1)(f + b) = 3/16 of the
  // work at half a core per rank, but not nothing (one stage alone cannot use both cores).
  json request = {{"layers", 8}, {"hidden", 64}, {"heads", 4}, {"vocab", 64}, {"seq_len", 32}, {"gpus_per_node", 4},
                  {"device", "cpu"}, {"cores_per_node", 2}, {"cpu_mem", 16}, {"global_batch", 8}, {"pp", 4}, {"tp", 1},
                  {"cp", 1}, {"zero", 0}, {"micro_batch", 1}, {"intra_node_bw", 1e9}, {"collective_latency_us", 1e-9},
                  {"offload", false}, {"activation_checkpointing", "none"}, {"calibration_cache", ""},
                  {"schedule", "1f1b"}};
  const PlanResult r = plan(plan_inputs_from_json(request));
  REQUIRE(r.ranked.size() == 1);
  const StepCost& c = r.ranked[0].cost;
  CHECK(c.bubble < 3.0 / 16 * c.compute);
  CHECK(c.bubble > 0);
}

TEST_CASE("planner: ZeRO's collectives - each at its rate - ZeRO-3's overlapped with the compute - the fold of each micro-batch") {
  json request = {{"layers", 4}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"seq_len", 64}, {"gpus_per_node", 4},
                  {"gpu_mem", 80}, {"global_batch", 16}, {"pp", 1}, {"tp", 1}, {"cp", 1}, {"micro_batch", 2},
                  {"intra_node_bw", 2.0}, {"collective_latency_us", 10}, {"device_memory_bw", 100}, {"offload", false},
                  {"activation_checkpointing", "none"}};
  auto cost_at = [&](int zero, double exposed) {
    json one = request;
    one["zero"] = zero;
    one["overlap_exposed"] = exposed;
    const PlanResult r = plan(plan_inputs_from_json(one));
    REQUIRE(r.ranked.size() == 1);
    return std::make_pair(r.ranked[0].cost, r.ranked[0].layout);
  };
  const auto [stage0, layout] = cost_at(0, 0.0);
  const PlanInputs in = plan_inputs_from_json(request);
  const double P = double(estimate_of(in, layout).params_per_gpu), n = 4, m = double(layout.gradient_accumulation);
  REQUIRE(m == 2);
  // The fold: the gradient read, the fp32 buffer read and written, each micro-batch.
  CHECK(stage0.accumulate == Approx(m * (4 + 8) * P / 100e9));
  // Stage 0, the model in one bucket: its allreduce after the backward, all of it (ring: 2(n-1)/n).
  CHECK(stage0.data == Approx(10e-6 + 2 * (n - 1) / n * 4 * P / 2e9));
  // Stage 1: the reduce-scatter and the allgather, each (n-1)/n of the buffer.
  CHECK(cost_at(1, 0.0).first.data == Approx(2 * (10e-6 + (n - 1) / n * 4 * P / 2e9)));
  // Stage 3: m reduce-scatters and 2m gathers, overlapped with the step's compute: what it cannot
  // hide, and at least the exposed share.
  const StepCost paid = cost_at(3, 1.0).first;
  const double comm = 3 * m * (10e-6 + (n - 1) / n * 4 * P / 2e9);
  CHECK(paid.data == Approx(comm));
  CHECK(cost_at(3, 0.25).first.data == Approx(std::max(comm - paid.compute, 0.25 * comm)));
  CHECK(cost_at(3, 0.0).first.data == Approx(std::max(comm - paid.compute, 0.0)));
  json bad = request;
  bad["overlap_exposed"] = 2;
  CHECK_THROWS_WITH(plan_inputs_from_json(bad), Catch::Contains("overlap_exposed: a number from 0"));
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
  // The probe's rounds: one time per shape, every shape's threads on the node's cores.
  LayerShape small;
  small.micro = 1, small.tokens = 16, small.seq_len = 16, small.hidden = 32, small.heads = 2, small.kv_heads = 2;
  small.ffn = 64, small.linear_in = 96, small.linear_out = 32;
  LayerShape wider = small;
  wider.micro = 4;
  const std::vector<double> rounds = time_layers({small, wider}, at::kFloat, 2, 1);
  REQUIRE(rounds.size() == 2);
  CHECK(rounds[0] > 0);
  CHECK(rounds[1] > 0);
  // Next time: cached, nothing timed again for the same layouts, the same prediction.
  request.erase("measure");
  const PlanInputs cached = plan_inputs_from_json(request);
  CHECK(contains(cached.calibration.tflops.source, "cached ("));
  const PlanResult again = plan(cached);
  CHECK(again.calibration.to_json()["shapes_timed_now"].get<int>() == 0);
  REQUIRE(again.ranked.size() == r.ranked.size());
  CHECK(again.ranked[0].cost.total() == Approx(r.ranked[0].cost.total()));
}

TEST_CASE("tessera plan's table: every row's numbers start in the same column, counted in characters") {
  // The labels hold "·" and "×", two bytes each in UTF-8: padding by bytes would shift the rows.
  const std::string table = format_plan(plan(plan_inputs_from_json(medium_request())), 8);
  std::istringstream lines(table);
  std::vector<size_t> starts;  // the character column where each row's step time begins
  bool in_table = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("#    layout", 0) == 0) {
      in_table = true;
    } else if (in_table && line.empty()) {
      break;
    } else if (in_table) {
      // A row's label ends "micro M × G"; past G and the padding, the step time begins.
      size_t i = line.find("\xc3\x97", line.find("micro "));
      REQUIRE(i != std::string::npos);
      i += 2;
      while (line[i] == ' ') ++i;
      while (std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
      while (line[i] == ' ') ++i;
      size_t columns = 0;
      for (size_t b = 0; b < i; ++b) columns += (static_cast<unsigned char>(line[b]) & 0xC0) != 0x80;
      starts.push_back(columns);
    }
  }
  INFO(table);
  REQUIRE(starts.size() >= 2);
  CHECK(std::all_of(starts.begin(), starts.end(), [&](size_t c) { return c == starts.front(); }));
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

TEST_CASE("tessera plan --trials: the top layouts run with the real engine - measured against predicted - the fastest written") {
  tessera::testing::TempDir dir;
  // The example GPT's default shape is the tessera-gpt preset (4 layers x 128, 4 heads, vocab 256, block 128).
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "tessera-gpt", "--device", "cpu",
                                  "--gpus-per-node", "2", "--cpu-mem", "16", "--global-batch", "4", "--no-offload",
                                  "--no-cp", "--activation-checkpointing", "none", "--zero", "1", "--tp", "1",
                                  "--pp", "1", "--trials", "2", "--json", "--write-config", dir.file("chosen.json"),
                                  "--master-port", std::to_string(tessera::testing::free_port()), "--",
                                  TESSERA_TRAIN_GPT_PATH, "--steps", "3"},
                                 {}, 240);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const json answer = json::parse(r.output.substr(r.output.find("\n{") + 1));
  REQUIRE(answer["trials"].size() == 2);
  double best = 1e30;
  json chosen_layout;
  for (const auto& t : answer["trials"]) {
    REQUIRE(t.contains("measured_seconds"));
    CHECK(t["measured_seconds"].get<double>() > 0);
    CHECK(t["measured_over_predicted"].get<double>() > 0);
    if (t["measured_seconds"].get<double>() < best) best = t["measured_seconds"], chosen_layout = t["layout"];
  }
  CHECK(answer["trials"][0]["layout"] == answer["ranked"][0]["layout"]);
  const json written = json::parse(tessera::testing::run({"cat", dir.file("chosen.json")}).output);
  CHECK(written == answer["chosen"]);
  CHECK(written["train_micro_batch_size_per_gpu"] == chosen_layout["micro_batch"]);
  // Without a program there is nothing to try.
  auto none = tessera::testing::run({TESSERA_CLI_PATH, "plan", "--preset", "tessera-gpt", "--global-batch", "4",
                                     "--trials", "1"}, {}, 60);
  CHECK(none.status == 2);
  CHECK(contains(none.output, "--trials needs the training program after --"));
}

namespace {

// The example GPT's default shape on CPU ranks; ZeRO stage, micro-batch and tp left to the planner.
json auto_config() {
  return json::parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto",
                         "zero_optimization": {"stage": "auto"}, "tensor_parallel": {"tp_size": "auto"},
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "steps_per_print": 1})");
}
const json kGptModel = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"cpu_mem", 16}};

}  // namespace

TEST_CASE("auto layout: the context-parallel degree \"auto\" - context_parallel.size or sequence_parallel_size - searched, written back") {
  // A long sequence on 4 CPU ranks: cp is one of the searched degrees; whatever wins is written
  // as context_parallel.size (1 left out), and the config checks at that degree.
  const json model = {{"layers", 4}, {"hidden", 256}, {"heads", 4}, {"vocab", 256}, {"seq_len", 1024},
                      {"device", "cpu"}, {"cpu_mem", 16}};
  for (const char* key : {"context_parallel", "sequence_parallel_size"}) {
    json config = json::parse(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 1},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})");
    if (std::string(key) == "context_parallel") config["context_parallel"] = {{"size", "auto"}};
    else config["sequence_parallel_size"] = "auto";
    const AutoLayout resolved = resolve_auto_layout(config, 4, model);
    INFO(key << "\n" << resolved.config.dump(2) << "\n" << resolved.line);
    CHECK(contains(resolved.line, std::string("searched ") + (std::string(key) == "context_parallel" ? "context_parallel.size"
                                                                                                     : "sequence_parallel_size")));
    CHECK_FALSE(has_auto_layout(resolved.config));
    CHECK_FALSE(resolved.config.contains("sequence_parallel_size"));
    // The same as the planner's own first choice with cp searched and the rest fixed.
    json request = model;
    request.update({{"global_batch", 4}, {"gpus_per_node", 4}, {"zero", 1}, {"tp", 1}, {"pp", 1}, {"micro_batch", 1},
                    {"offload_optimizer", "none"}, {"offload_param", "none"}, {"activation_checkpointing", "none"},
                    {"schedule", "1f1b"}, {"calibration_cache", ""}});
    json base = config;
    base.erase("train_micro_batch_size_per_gpu");
    base.erase("sequence_parallel_size");
    request["config"] = base;
    const PlanResult plan = planner::plan(plan_inputs_from_json(request));
    REQUIRE_FALSE(plan.ranked.empty());
    std::set<int> cps;
    for (const auto& c : plan.ranked) cps.insert(c.layout.cp);
    CHECK(cps.size() > 1);  // context parallelism was among the layouts searched
    const int chosen = resolved.config.contains("context_parallel") ? resolved.config["context_parallel"].value("size", 1) : 1;
    CHECK(chosen == plan.ranked.front().layout.cp);
    ConfigReport report;
    ResolvedLayout layout;
    parse_and_resolve_config(resolved.config, 4, report, &layout);
    CHECK(report.ok());
  }
}

TEST_CASE("auto layout: the \"auto\" keys are searched - the rest fixed - the planner's first choice written in - one line says why") {
  const AutoLayout resolved = resolve_auto_layout(auto_config(), 4, kGptModel);
  INFO(resolved.config.dump(2) << "\n" << resolved.line);
  CHECK(contains(resolved.line, "tessera: auto layout for 4 ranks: "));
  CHECK(contains(resolved.line, "searched zero_optimization.stage, tensor_parallel.tp_size, train_micro_batch_size_per_gpu"));
  CHECK(contains(resolved.line, "rates: default"));  // every rank alike: no probe at start
  CHECK_FALSE(has_auto_layout(resolved.config));
  // The same as tessera plan with the other keys fixed, on the defaults.
  json request = kGptModel;
  request.update({{"global_batch", 8}, {"gpus_per_node", 4}, {"pp", 1}, {"cp", 1}, {"offload_optimizer", "none"},
                  {"offload_param", "none"}, {"activation_checkpointing", "none"}, {"calibration_cache", ""}});
  json base = auto_config();
  base.erase("train_micro_batch_size_per_gpu");
  request["config"] = base;
  const PlanResult plan = planner::plan(plan_inputs_from_json(request));
  REQUIRE_FALSE(plan.ranked.empty());
  CHECK(resolved.config == plan.ranked.front().config);
  CHECK(resolved.config["optimizer"]["params"]["lr"] == 0.001);  // the config's other keys kept
  CHECK(resolved.config["steps_per_print"] == 1);
  ConfigReport report;
  ResolvedLayout layout;
  parse_and_resolve_config(resolved.config, 4, report, &layout);
  CHECK(report.ok());
  CHECK(layout.pipe == 1);  // fixed: not "auto"
  // Nothing "auto" (or only Hugging Face's micro-batch placeholder): unchanged, no line.
  json plain = auto_config();
  plain["zero_optimization"]["stage"] = 1, plain["tensor_parallel"]["tp_size"] = 1;
  const AutoLayout untouched = resolve_auto_layout(plain, 4, kGptModel);
  CHECK(untouched.config == plain);
  CHECK(untouched.line.empty());
  // What cannot be planned says which key.
  json no_batch = auto_config();
  no_batch.erase("train_batch_size");
  CHECK_THROWS_WITH(resolve_auto_layout(no_batch, 4, kGptModel), Catch::Contains("train_batch_size: the layout planner keeps"));
  json accumulation = auto_config();
  accumulation["gradient_accumulation_steps"] = 2;
  CHECK_THROWS_WITH(resolve_auto_layout(accumulation, 4, kGptModel), Catch::Contains("gradient_accumulation_steps: leave it out"));
  json measured = kGptModel;
  measured["measure"] = true;
  CHECK_THROWS_WITH(resolve_auto_layout(auto_config(), 4, measured), Catch::Contains("measure: not at start"));
  CHECK_THROWS_WITH(resolve_auto_layout(auto_config(), 4, json::object()), Catch::Contains("no model"));
}

TEST_CASE("auto layout: tessera config check --plan resolves it as C++ does - train_gpt trains the same as with the values written out") {
  tessera::testing::TempDir dir;
  const std::string auto_path = dir.file("auto.json"), explicit_path = dir.file("explicit.json");
  std::ofstream(auto_path) << auto_config().dump(2);
  const AutoLayout resolved = resolve_auto_layout(auto_config(), 2, kGptModel);
  std::ofstream(explicit_path) << resolved.config.dump(2);
  auto check = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", auto_path, "--world-size", "2", "--plan",
                                      kGptModel.dump()}, {}, 60);
  INFO(check.output);
  REQUIRE(check.status == 0);
  CHECK(contains(check.output, resolved.line));
  const json effective = json::parse(check.output.substr(check.output.find("\n{") + 1));
  CHECK(effective["zero_optimization"]["stage"] == resolved.config["zero_optimization"]["stage"]);
  CHECK(effective["train_micro_batch_size_per_gpu"] == resolved.config["train_micro_batch_size_per_gpu"]);
  auto without_model = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", auto_path, "--world-size", "2"}, {}, 60);
  CHECK(without_model.status == 1);
  CHECK(contains(without_model.output, "--plan gives the planner the model and hardware"));
  // train_gpt resolves it from its own shape, the same way; then trains exactly as with the values.
  namespace ex = tessera::testing::examples;
  auto with_auto = ex::run_example(TESSERA_TRAIN_GPT_PATH, 2, auto_path, 3, tessera::testing::free_port(),
                                   {"--save-parameters", dir.file("auto.bin")});
  INFO(with_auto.output);
  REQUIRE(with_auto.status == 0);
  CHECK(contains(with_auto.output, resolved.line));
  auto written = ex::run_example(TESSERA_TRAIN_GPT_PATH, 2, explicit_path, 3, tessera::testing::free_port(),
                                 {"--save-parameters", dir.file("explicit.bin")});
  INFO(written.output);
  REQUIRE(written.status == 0);
  CHECK(ex::final_loss(with_auto.output) == ex::final_loss(written.output));
  CHECK(ex::grad_norms(with_auto.output) == ex::grad_norms(written.output));
  CHECK(ex::max_difference(ex::read_parameters(dir.file("auto.bin")), ex::read_parameters(dir.file("explicit.bin"))) == 0.0);
}

TEST_CASE("auto layout: activation checkpointing \"auto\" - chosen when only it fits - written where the model reads it - train_gpt recomputes") {
  // GPT-2 medium on 8 GPUs of 10 GB at micro-batch 8: its activations fit only recomputed.
  json model = {{"preset", "gpt2-medium"}, {"bf16", true}, {"gpu_mem", 10}};
  json config = {{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8}, {"bf16", {{"enabled", true}}},
                 {"zero_optimization", {{"stage", 3}}}, {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                 {"activation_checkpointing", {{"number_checkpoints", "auto"}}}};
  const AutoLayout tight = resolve_auto_layout(config, 8, model);
  INFO(tight.line << "\n" << tight.config.dump(2));
  CHECK(contains(tight.line, "searched activation_checkpointing.number_checkpoints"));
  CHECK(tight.config["activation_checkpointing"]["number_checkpoints"] == 24);
  CHECK_FALSE(has_auto_layout(tight.config));
  // Room enough: not chosen (the recompute costs a third of the forward and backward).
  model["gpu_mem"] = 80;
  const AutoLayout roomy = resolve_auto_layout(config, 8, model);
  INFO(roomy.line);
  CHECK_FALSE(roomy.config.contains("activation_checkpointing"));
  // Under a pipeline it is the pipeline's interval.
  model["gpu_mem"] = 8;
  json piped = config;
  piped.erase("activation_checkpointing");
  piped["zero_optimization"]["stage"] = 1;
  piped["pipeline"] = {{"stages", 2}, {"activation_checkpoint_interval", "auto"}};
  const AutoLayout staged = resolve_auto_layout(piped, 8, model);
  INFO(staged.line << "\n" << staged.config.dump(2));
  CHECK(contains(staged.line, "searched pipeline.activation_checkpoint_interval"));
  CHECK(staged.config["pipeline"]["activation_checkpoint_interval"] == 1);
  // train_gpt reads what was written: an activation_checkpointing section recomputes every block,
  // as --checkpoint-activations does, and trains the same as without it.
  tessera::testing::TempDir dir;
  const json small = {{"train_batch_size", 2}, {"train_micro_batch_size_per_gpu", 2}, {"steps_per_print", 1},
                      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
  json with_section = small;
  with_section["activation_checkpointing"] = {{"number_checkpoints", 4}};
  std::ofstream(dir.file("section.json")) << with_section.dump();
  std::ofstream(dir.file("plain.json")) << small.dump();
  namespace ex = tessera::testing::examples;
  auto from_config = ex::run_example(TESSERA_TRAIN_GPT_PATH, 1, dir.file("section.json"), 2, tessera::testing::free_port());
  auto from_flag = ex::run_example(TESSERA_TRAIN_GPT_PATH, 1, dir.file("plain.json"), 2, tessera::testing::free_port(),
                                   {"--checkpoint-activations"});
  auto without = ex::run_example(TESSERA_TRAIN_GPT_PATH, 1, dir.file("plain.json"), 2, tessera::testing::free_port());
  INFO(from_config.output);
  REQUIRE(from_config.status == 0);
  REQUIRE(from_flag.status == 0);
  REQUIRE(without.status == 0);
  CHECK(contains(from_config.output, "activation checkpointing: every block recomputed"));
  CHECK(contains(from_flag.output, "activation checkpointing: every block recomputed"));
  CHECK_FALSE(contains(without.output, "activation checkpointing"));
  CHECK(ex::final_loss(from_config.output) == ex::final_loss(from_flag.output));
  CHECK(ex::final_loss(from_config.output) == Approx(ex::final_loss(without.output)).epsilon(1e-5));
}
