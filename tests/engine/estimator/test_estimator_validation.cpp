// The estimator's acceptance check: its model states against the engine's measured buffers
// (tests/workers/engine_worker_memory.cpp --memory-sweep) on 1, 2 and 4 ranks, ZeRO 0-3, fp32 and bf16.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "engine/estimator/estimator.h"
#include "tests/subprocess.h"

using namespace tessera;

// ---- the acceptance check: estimate vs the engine's measured memory ------------------------------

namespace {

struct Measured {
  int64_t params, master, grads, states, buckets, offloaded = 0, offloaded_params = 0, host = 0, host_params = 0;
  int64_t model_states() const { return params + master + grads + states; }
};

// tests/workers/engine_worker.cpp --memory-sweep: ZeRO 0/1/2/3 x fp32/bf16, one Engine each; rank 0 prints.
// `extra`: more worker arguments (optimizer offload: ZeRO 1-3 only, so 6 lines instead of 8;
// parameter offload: ZeRO-3 only, 2 lines).
std::map<std::pair<int, std::string>, Measured> measure(int ranks, int hidden, int bucket,
                                                       const std::vector<std::string>& extra = {},
                                                       const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                   "--master-port", std::to_string(tessera::testing::free_port()), "--timeout", "60", "--",
                                   TESSERA_ENGINE_WORKER_PATH, "--memory-sweep", "--steps", "1", "--mb", "2",
                                   "--hidden", std::to_string(hidden), "--bucket", std::to_string(bucket)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = tessera::testing::run(argv, env, 120);
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::map<std::pair<int, std::string>, Measured> out;
  std::regex line("memory stage (\\d) dtype (\\w+): params (\\d+) master (\\d+) grads (\\d+) states (\\d+) buckets (\\d+) "
                  "offloaded (\\d+) offloaded_params (\\d+) host (\\d+) host_params (\\d+)");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
    const auto& m = *it;
    out[{std::stoi(m[1]), m[2]}] = {std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5]),
                                    std::stoll(m[6]), std::stoll(m[7]), std::stoll(m[8]), std::stoll(m[9]),
                                    std::stoll(m[10]), std::stoll(m[11])};
  }
  const bool param_offload = std::count(extra.begin(), extra.end(), std::string("--offload-param")) > 0;
  REQUIRE(out.size() == (param_offload ? 2u : extra.empty() ? 8u : 6u));
  return out;
}

// The worker's MLP, tensor by tensor, in the engine's two groups (weights, biases).
EstimateInputs worker_model(int ranks, int hidden, int bucket, int stage, const std::string& dtype) {
  const int64_t h1 = hidden ? hidden : 32, h2 = hidden ? hidden : 24;
  EstimateInputs in;
  in.model.name = "engine_worker MLP";
  auto add = [&](const char* name, int64_t numel, int group) {
    ParamTensor t;
    t.name = name;
    t.numel = numel;
    t.group = group;
    in.model.tensors.push_back(t);
  };
  add("w0", h1 * 16, 0);
  add("b0", h1, 1);
  add("w1", h2 * h1, 0);
  add("b1", h2, 1);
  add("w2", 8 * h2, 0);
  in.hardware.device = "cpu";
  in.hardware.gpus_per_node = ranks;
  in.setup.zero_stage = stage;
  in.setup.precision = dtype;
  in.setup.optimizer = "AdamW";
  in.setup.reduce_bucket_size = bucket;
  in.setup.stage3_param_persistence_threshold = 0;  // the worker partitions every parameter at stage 3
  in.search = false;
  return in;
}

}  // namespace

TEST_CASE("validation: estimated model states within 5% of the engine's measured memory (1/2/4 ranks - ZeRO 0/1/2/3 - fp32/bf16)") {
  struct Case {
    int ranks, hidden, bucket;
  };
  // The 1528-parameter MLP (one bucket per group; and 300-element buckets: padding in every
  // bucket), and a 1,075,200-parameter one (16 -> 1024 -> 1024 -> 8) in three buckets.
  const std::vector<Case> cases = {{1, 0, 1000000}, {2, 0, 1000000}, {4, 0, 1000000}, {4, 0, 300},
                                   {1, 1024, 1000000}, {2, 1024, 1000000}, {4, 1024, 1000000}};
  double worst = 0;
  for (const Case& c : cases) {
    auto measured = measure(c.ranks, c.hidden, c.bucket);
    for (int stage : {0, 1, 2, 3}) {
      for (std::string dtype : {"fp32", "bf16"}) {
        const Measured& m = measured.at({stage, dtype});
        EstimateResult e = estimate(worker_model(c.ranks, c.hidden, c.bucket, stage, dtype));
        const double err = std::abs(double(e.per_gpu.model_states) - double(m.model_states())) / m.model_states();
        worst = std::max(worst, err);
        std::printf("validation: ranks %d, MLP %s, bucket %d, ZeRO-%d %s: measured model states %lld, estimated %lld "
                    "(%.3f%%); buckets measured %lld, estimated %lld\n",
                    c.ranks, c.hidden ? "1.08M" : "1528", c.bucket, stage, dtype.c_str(), (long long)m.model_states(),
                    (long long)e.per_gpu.model_states, 100 * err, (long long)m.buckets,
                    (long long)e.per_gpu.bytes("communication buckets"));
        INFO("ranks " << c.ranks << " hidden " << c.hidden << " bucket " << c.bucket << " stage " << stage << " " << dtype);
        CHECK(err <= 0.05);
        // Line by line, the estimate is the engine's own buffers.
        CHECK(e.per_gpu.bytes("parameters") == m.params);
        CHECK(e.per_gpu.bytes("fp32 master weights") == m.master);
        CHECK(e.per_gpu.bytes("gradients") == m.grads);
        CHECK(e.per_gpu.bytes("optimizer states") == m.states);
        // The engine reports the staging buffers it allocated; the estimate is the planner's
        // bound (two per group), which the engine reaches or stays under.
        CHECK(e.per_gpu.bytes("communication buckets") >= m.buckets);
        CHECK(e.validated);
      }
    }
  }
  std::printf("validation: worst model-state error %.4f%%\n", 100 * worst);
}

TEST_CASE("validation: NVMe and CPU optimizer offload on CPU ranks - the estimate is the engine's buffers and files") {
  testing::TempDir dir;
  const int64_t tile = 100000;
  for (int ranks : {1, 2}) {
    for (const std::string device : {"nvme", "cpu"}) {
      auto measured = measure(ranks, 1024, 1000000,
                              {"--offload", device, "--nvme-path", dir.path, "--tile", std::to_string(tile), "--buffers", "3"});
      for (int stage : {1, 2, 3}) {
        for (std::string dtype : {"fp32", "bf16"}) {
          const Measured& m = measured.at({stage, dtype});
          EstimateInputs in = worker_model(ranks, 1024, 1000000, stage, dtype);
          in.setup.offload_optimizer = device;
          in.setup.sub_group_size = tile;
          in.setup.optimizer_buffer_count = 3;
          EstimateResult e = estimate(in);
          INFO("ranks " << ranks << " " << device << " stage " << stage << " " << dtype);
          std::printf("validation: ranks %d, offload %s, ZeRO-%d %s: measured in memory %lld (states %lld), in files %lld; "
                      "estimated %lld (states %lld), on NVMe %lld\n",
                      ranks, device.c_str(), stage, dtype.c_str(), (long long)m.model_states(), (long long)m.states,
                      (long long)m.offloaded, (long long)e.per_gpu.model_states, (long long)e.per_gpu.bytes("optimizer states"),
                      (long long)e.per_node_nvme.bytes("optimizer states"));
          CHECK(e.per_gpu.bytes("parameters") == m.params);
          CHECK(e.per_gpu.bytes("fp32 master weights") == m.master);
          CHECK(e.per_gpu.bytes("gradients") == m.grads);
          CHECK(e.per_gpu.bytes("optimizer states") == m.states);
          CHECK(e.per_node_nvme.bytes("optimizer states") == ranks * m.offloaded);  // NVMe lines are per node
          CHECK(e.validated);
          if (device == "nvme") CHECK(m.states <= 3 * (4 * tile * 3 + 4096));
          else CHECK(m.offloaded == 0);
        }
      }
    }
  }
}

TEST_CASE("validation: NVMe parameter offload on CPU ranks (ZeRO-3) - the estimate is the engine's buffers and files") {
  testing::TempDir dir;
  for (int ranks : {1, 2})
    for (const std::string optimizer : {"none", "nvme"}) {
      std::vector<std::string> extra = {"--offload-param", "nvme", "--param-path", dir.path, "--param-buffers", "3"};
      if (optimizer == "nvme") extra.insert(extra.end(), {"--offload", "nvme", "--nvme-path", dir.path, "--tile", "100000", "--buffers", "2"});
      auto measured = measure(ranks, 1024, 1000000, extra);
      for (std::string dtype : {"fp32", "bf16"}) {
        const Measured& m = measured.at({3, dtype});
        EstimateInputs in = worker_model(ranks, 1024, 1000000, 3, dtype);
        in.setup.offload_param = "nvme";
        in.setup.param_buffer_count = 3;
        if (optimizer == "nvme") {
          in.setup.offload_optimizer = "nvme";
          in.setup.sub_group_size = 100000;
          in.setup.optimizer_buffer_count = 2;
        }
        EstimateResult e = estimate(in);
        INFO("ranks " << ranks << " optimizer offload " << optimizer << " " << dtype);
        std::printf("validation: ranks %d, offload_param nvme, optimizer %s, ZeRO-3 %s: measured parameters in memory %lld, "
                    "in files %lld; estimated %lld, on NVMe %lld\n",
                    ranks, optimizer.c_str(), dtype.c_str(), (long long)m.params, (long long)m.offloaded_params,
                    (long long)e.per_gpu.bytes("parameters"), (long long)e.per_node_nvme.bytes("parameters"));
        CHECK(m.offloaded_params > 0);
        CHECK(e.per_gpu.bytes("parameters") == m.params);
        CHECK(e.per_node_nvme.bytes("parameters") == ranks * m.offloaded_params);
        CHECK(e.per_gpu.bytes("fp32 master weights") == m.master);
        CHECK(e.per_gpu.bytes("gradients") == m.grads);
        CHECK(e.per_gpu.bytes("optimizer states") == m.states);
        CHECK(e.per_node_nvme.bytes("optimizer states") == ranks * m.offloaded);
        CHECK(e.validated);
      }
    }
}

// GPU ranks' offload (the optimizer to host memory or NVMe, ZeRO-3's shards to host memory or NVMe),
// measured through the GPU ranks' own code path on CPU ranks (TESSERA_HOST_STAGING=1, whose
// buffers are the GPU ranks' buffers): the estimate for a GPU is those buffers, device and host.
TEST_CASE("validation: GPU ranks' optimizer and parameter offload - the estimate is the engine's device and host buffers") {
  testing::TempDir dir;
  struct Case {
    std::string optimizer, param;
    bool super_offload = false;  // the copies of what each speculated step writes, in host memory
  };
  for (int ranks : {1, 2})
    for (const Case& c : std::vector<Case>{{"cpu", "none"}, {"nvme", "none"}, {"cpu", "cpu"}, {"nvme", "cpu"},
                                           {"cpu", "nvme"}, {"nvme", "nvme"}, {"cpu", "none", true}}) {
      std::vector<std::string> extra = {"--offload", c.optimizer, "--nvme-path", dir.path, "--tile", "100000",
                                        "--buffers", "3"};
      if (c.super_offload) extra.push_back("--super-offload");
      if (c.param != "none") extra.insert(extra.end(), {"--offload-param", c.param});
      if (c.param == "nvme") extra.insert(extra.end(), {"--param-path", dir.path, "--param-buffers", "2"});
      auto measured = measure(ranks, 1024, 300000, extra, {{"TESSERA_HOST_STAGING", "1"}});
      for (const auto& [key, m] : measured) {
        const auto& [stage, dtype] = key;
        EstimateInputs in = worker_model(ranks, 1024, 300000, stage, dtype);
        in.hardware.device = "gpu";
        in.hardware.gpu_memory = int64_t(80) << 30;
        in.hardware.cpu_memory = int64_t(1) << 40;
        in.hardware.nvme_capacity = int64_t(1) << 40;
        in.setup.offload_optimizer = c.optimizer;
        in.setup.offload_param = c.param;
        in.setup.super_offload = c.super_offload;
        in.setup.sub_group_size = 100000;
        in.setup.optimizer_buffer_count = 3;
        in.setup.param_buffer_count = 2;
        EstimateResult e = estimate(in);
        INFO("ranks " << ranks << " offload_optimizer " << c.optimizer << " offload_param " << c.param
                      << (c.super_offload ? " super_offload" : "") << " stage " << stage << " " << dtype);
        const int64_t host_estimated = e.per_node_cpu.model_states / ranks;
        std::printf("validation: GPU ranks %d, offload_optimizer %s, offload_param %s, ZeRO-%d %s: device measured %lld, "
                    "estimated %lld; host measured %lld, estimated %lld; NVMe measured %lld, estimated %lld\n",
                    ranks, c.optimizer.c_str(), c.param.c_str(), stage, dtype.c_str(), (long long)m.model_states(),
                    (long long)e.per_gpu.model_states, (long long)(m.host + m.host_params), (long long)host_estimated,
                    (long long)(ranks * m.offloaded), (long long)e.per_node_nvme.bytes("optimizer states"));
        CHECK(m.host > 0);
        CHECK(m.master == 0);
        CHECK(m.states == 0);
        CHECK((m.host_params > 0) == (c.param != "none"));  // the shards, or NVMe's swap buffers
        CHECK((m.offloaded_params > 0) == (c.param == "nvme"));
        CHECK(e.per_node_nvme.bytes("parameters") == ranks * m.offloaded_params);
        CHECK(e.per_gpu.bytes("parameters") == m.params);
        CHECK(e.per_gpu.bytes("fp32 master weights") == 0);
        CHECK(e.per_gpu.bytes("gradients") == m.grads);
        CHECK(e.per_gpu.bytes("optimizer states") == 0);
        CHECK(e.per_gpu.model_states == m.model_states());
        CHECK(e.per_node_cpu.model_states == ranks * (m.host + m.host_params));
        CHECK(e.per_node_nvme.bytes("optimizer states") == ranks * m.offloaded);
        CHECK(e.validated);
      }
    }
}

// MoE: the example GPT with 4 experts in every other block (the tessera-gpt preset with the config's
// moe section), on 4 ranks with ep 2: each rank holds 2 experts per MoE block, partitioned over the
// 2 ranks that hold the same ones. The estimate's lines are rank 0's engine buffers, exactly.
TEST_CASE("validation: MoE expert parallelism - experts over ep and their state over dp/ep - the estimate is the engine's buffers") {
  for (int stage : {0, 1, 2}) {
    const std::string config = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": )" + std::to_string(stage) + R"(},
        "moe": {"num_experts": 4, "every": 2, "k": 2, "ep_size": 2}})";
    tessera::testing::TempDir dir;
    const std::string path = dir.file("moe.json");
    if (std::FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(config.c_str(), f);
      std::fclose(f);
    }
    auto r = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "4", "--master-port",
                                    std::to_string(tessera::testing::free_port()), "--", TESSERA_TRAIN_GPT_PATH,
                                    "--config", path, "--steps", "1"},
                                   {}, 120);
    INFO(r.output);
    REQUIRE(r.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m, std::regex("engine memory \\(bytes\\): params (\\d+) master (\\d+) grads (\\d+) states (\\d+)")));
    EstimateInputs in;
    in.model.shape = find_preset("tessera-gpt")->shape;
    in.hardware.device = "cpu";
    in.hardware.gpus_per_node = 4;
    in.setup.zero_stage = stage;
    in.setup.optimizer = "AdamW";
    in.setup.reduce_bucket_size = 500000000;
    MoeConfig moe;
    moe.num_experts = 4;
    moe.ep_size = 2;
    in.setup.moe = moe;
    in.search = false;
    EstimateResult e = estimate(in);
    INFO("ZeRO-" << stage);
    CHECK(e.per_gpu.bytes("parameters") == std::stoll(m[1]));
    CHECK(e.per_gpu.bytes("gradients") == std::stoll(m[3]));
    CHECK(e.per_gpu.bytes("optimizer states") == std::stoll(m[4]));
    CHECK(e.validated);
  }
}
