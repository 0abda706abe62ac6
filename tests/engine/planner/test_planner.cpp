// The layout planner (engine/planner/): its enumeration against the estimator's own numbers and the
// engine's config rules, the step-cost model's pipeline bubble against the closed form and the
// schedule simulator, the calibration's sources and cache, the configs it writes, and the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "engine/planner/planner.h"
#include "engine/planner/probe.h"
#include "engine/planner/shared_cores.h"
#include "parallel/communicator.h"
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

TEST_CASE("planner: how the model splits its work is kept from the config - sequence parallelism estimated where tp > 1 and written where it applies - the context-parallel method") {
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
  // So is the context-parallel method (the degree is the planner's).
  json ring = medium_request();
  ring["config"] = {{"context_parallel", {{"method", "ring"}}}};
  for (const auto& c : plan(plan_inputs_from_json(ring)).ranked) CHECK(c.config["context_parallel"]["method"] == "ring");
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
  // ZB-H1 (B and W half a backward each), interleaved 1F1B and ZB-V (two chunks a stage, each half the
  // stage's work) are timed by their own schedules: the simulator's idle share, below 1F1B's.
  for (const std::string schedule : {"zb_h1", "interleaved_1f1b", "zb_v"})
    for (int micro : {1, 2}) {
      request["schedule"] = schedule;
      request["micro_batch"] = micro;
      const PlanResult r = plan(plan_inputs_from_json(request));
      REQUIRE(r.ranked.size() == 1);
      const Layout& l = r.ranked[0].layout;
      CHECK(l.schedule == schedule);
      CHECK(l.virtual_stages == (schedule == "zb_h1" ? 1 : 2));
      if (schedule == "zb_v") CHECK_THAT(l.label(), Catch::Contains("zb-v"));
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
  // Searched when not fixed: the four schedules under a pipeline, none without one.
  request.erase("schedule");
  request["micro_batch"] = 1;
  std::set<std::string> schedules;
  for (const auto& c : plan(plan_inputs_from_json(request)).ranked) schedules.insert(c.layout.schedule);
  CHECK(schedules == std::set<std::string>{"1f1b", "interleaved_1f1b", "zb_h1", "zb_v"});
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
  // Stage 3: m reduce-scatters and 2m gathers, one collective a unit (a layer: 4), overlapped with
  // the step's compute: what it cannot hide, and at least the exposed share.
  const StepCost paid = cost_at(3, 1.0).first;
  const double comm = 3 * m * (4 * 10e-6 + (n - 1) / n * 4 * P / 2e9);
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

TEST_CASE("planner: the links between nodes as tessera probe-link cached them - unless given") {
  tessera::testing::TempDir dir;
  const std::string cache = dir.file("calibration.json");
  json request = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 1}, {"nodes", 2},
                  {"global_batch", 4}, {"cpu_mem", 16}, {"offload", false}, {"cp_search", false},
                  {"calibration_cache", cache}};
  const double before = plan_inputs_from_json(request).calibration.inter_node_gbps.value;
  CHECK(contains(plan_inputs_from_json(request).calibration.inter_node_gbps.source, "default"));
  LinkProbe probe;
  probe.bus_gbps = 0.116, probe.latency_us = 293;
  REQUIRE(save_inter_node_probe(cache, probe, "of 32 MiB across 2 ranks (1 a host)"));
  const PlanInputs probed = plan_inputs_from_json(request);
  CHECK(probed.calibration.inter_node_gbps.value == Approx(0.116));
  CHECK(contains(probed.calibration.inter_node_gbps.source, "cached (" + cache));
  CHECK(contains(probed.calibration.inter_node_gbps.source,
                 "tessera probe-link, Gloo reduce-scatter + all-gather of 32 MiB across 2 ranks (1 a host)"));
  // A layout whose data group spans the nodes pays the probed link: the prediction changes.
  CHECK(before != Approx(0.116));
  const PlanResult slow = plan(probed);
  request["inter_node_bw"] = before;
  const PlanInputs given = plan_inputs_from_json(request);
  CHECK(given.calibration.inter_node_gbps.source == "given");
  const PlanResult fast = plan(given);
  // The same layout with its data group across the nodes, in both.
  auto spanning = [](const PlanResult& r, const std::string& label) {
    for (const auto& c : r.ranked)
      if (c.layout.dp == 2 && (label.empty() || c.layout.label() == label)) return c;
    FAIL("no layout of dp 2 " + label);
    return r.ranked.front();
  };
  const auto slow_dp = spanning(slow, "");
  CHECK(slow_dp.cost.total() > spanning(fast, slow_dp.layout.label()).cost.total());
  // The per-CPU probe written later keeps the entry.
  request.erase("inter_node_bw");
  request["measure"] = true;
  plan_inputs_from_json(request);
  request.erase("measure");
  CHECK(plan_inputs_from_json(request).calibration.inter_node_gbps.value == Approx(0.116));
}

TEST_CASE("planner: a node's collectives timed as the engine runs them - in processes - between compute segments") {
  // The probe's ranks are processes running the engine's algorithms (the Communicator's defaults
  // resolved for Gloo as ParallelContext resolves them); every figure is measured, and the latency
  // between compute segments for each group size that divides the ranks.
  const CommunicatorOptions gloo = with_backend_defaults({}, true), nccl = with_backend_defaults({}, false);
  CHECK(gloo.pairwise_all_gather == 1);
  CHECK(gloo.pairwise_reduce_scatter == 1);
  CHECK(gloo.alltoall_reduce_scatter_max_bytes == std::numeric_limits<int64_t>::max());  // never Gloo's own
  CHECK(nccl.pairwise_all_gather == 0);
  CHECK(nccl.alltoall_reduce_scatter_max_bytes == 0);
  CommunicatorOptions chosen;
  chosen.pairwise_all_gather = 0;
  CHECK(with_backend_defaults(chosen, true).pairwise_all_gather == 0);  // a choice is kept
  const LinkProbe probe = time_gloo(2, int64_t(4) << 20);
  CHECK(probe.bus_gbps > 0);
  CHECK(probe.latency_us > 0);
  CHECK(probe.reduce_scatter_gbps > 0);
  CHECK(probe.all_gather_gbps > 0);
  CHECK(probe.all_reduce_gbps > 0);
  REQUIRE(probe.synced_latency_us.size() == 1);
  CHECK(probe.synced_latency_us.count(2) == 1);
  CHECK(probe.synced_latency_us.at(2) > 0);
  CHECK(time_copy_gbps(2) > 0);
}

TEST_CASE("planner: the probed collectives in the cost - at every size - the latency between compute segments") {
  tessera::testing::TempDir dir;
  const std::string cache = dir.file("calibration.json");
  json request = {{"preset", "tessera-gpt"}, {"device", "cpu"}, {"gpus_per_node", 4}, {"global_batch", 8},
                  {"cpu_mem", 16}, {"offload", false}, {"cp_search", false}, {"cores_per_node", 2},
                  {"calibration_cache", cache}};
  json links = {{"bus_gbps", 0.8}, {"latency_us", 500.0}, {"reduce_scatter_gbps", 0.7}, {"all_gather_gbps", 1.0},
                {"all_reduce_gbps", 0.9}, {"processes", true},
                {"large_reduce_scatter_gbps", 0.25},  // an older probe's key: ignored
                {"synced_latency_us", {{"2", 1500.0}, {"4", 2000.0}}}};
  json entry = {{"date", "2026-11-28 17:00 UTC"}, {"tflops_one_thread", 0.15}, {"host_memory_gbps", 24.0},
                {"host_memory_threads", 2}, {"links", {{"4 ranks on 2 cores", links}}}};
  {
    std::ofstream out(cache);
    out << json{{cpu_model_name() + " / fp32", entry}}.dump();
  }
  const Calibration cal = plan_inputs_from_json(request).calibration;
  using Collective = Calibration::Collective;
  const double small = 32 << 20, large = 128 << 20;
  // The engine's sends and receives at their probed rate whatever the size (Gloo's own reduce-scatter
  // is never run: parallel/communicator.h).
  CHECK(cal.collective_seconds(Collective::reduce_scatter, small, 4, false) == Approx(500e-6 + 0.75 * small / 0.7e9));
  CHECK(cal.collective_seconds(Collective::reduce_scatter, large, 4, false) == Approx(500e-6 + 0.75 * large / 0.7e9));
  CHECK(cal.collective_seconds(Collective::all_gather, large, 4, false) == Approx(500e-6 + 0.75 * large / 1.0e9));
  // Across nodes the ring's bytes over the link.
  const double link = cal.inter_node_gbps.value * 1e9;
  CHECK(cal.collective_seconds(Collective::reduce_scatter, large, 4, true) == Approx(500e-6 + 0.75 * large / link));
  CHECK(cal.collective_seconds(Collective::reduce_scatter, small, 4, true) == Approx(500e-6 + 0.75 * small / link));
  // Between compute segments: the group's size, or the next larger one probed; across nodes and
  // outside compute the idle latency.
  CHECK(cal.latency_seconds(2, false, true) == Approx(1500e-6));
  CHECK(cal.latency_seconds(3, false, true) == Approx(2000e-6));
  CHECK(cal.latency_seconds(4, false, false) == Approx(500e-6));
  CHECK(cal.latency_seconds(4, true, true) == Approx(500e-6));
  CHECK(cal.latency_seconds(8, false, true) == Approx(500e-6));
  CHECK(cal.collective_seconds(Collective::all_reduce, small, 4, false, true) == Approx(2000e-6 + 1.5 * small / 0.9e9));
  CHECK(contains(cal.host_memory_gbps.source, "256 MiB copied by 2 threads at once"));
  CHECK(contains(cal.intra_node_gbps.source, "among 4 ranks on 2 cores"));
  CHECK_FALSE(contains(cal.intra_node_gbps.source, "threads of one process"));
  CHECK(contains(cal.describe(), "2 ranks 1500 us, 4 ranks 2000 us"));
  CHECK(contains(cal.describe(), "reduce-scatter 0.7, all-gather 1, allreduce 0.9 GB/s"));
  CHECK_FALSE(contains(cal.describe(), "0.25"));
  // A tensor-parallel layout pays the synced latency: 4 allreduces a layer each way.
  request["tp"] = 2, request["pp"] = 1, request["zero"] = 0, request["micro_batch"] = 4;
  const PlanResult synced = plan(plan_inputs_from_json(request));
  links.erase("synced_latency_us");
  links.erase("processes");  // a cache from before the probe forked its ranks
  entry["links"]["4 ranks on 2 cores"] = links;
  {
    std::ofstream out(cache);
    out << json{{cpu_model_name() + " / fp32", entry}}.dump();
  }
  const PlanInputs old = plan_inputs_from_json(request);
  CHECK(contains(old.calibration.intra_node_gbps.source, "threads of one process"));
  CHECK(old.calibration.latency_seconds(2, false, true) == Approx(500e-6));
  const PlanResult idle = plan(old);
  REQUIRE_FALSE(synced.ranked.empty());
  const auto& with = synced.ranked[0];
  const auto without = std::find_if(idle.ranked.begin(), idle.ranked.end(),
                                    [&](const auto& c) { return c.layout.label() == with.layout.label(); });
  REQUIRE(without != idle.ranked.end());
  const double layers = 4, m = double(with.layout.gradient_accumulation);  // tessera-gpt: 4 layers
  CHECK(with.cost.tensor - without->cost.tensor == Approx(4 * layers * m * (1500e-6 - 500e-6)));
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
