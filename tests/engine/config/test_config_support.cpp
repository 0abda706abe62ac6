// Keys DeepSpeed has that the engine does not act on yet (engine/config/config_support.h): errors
// for what it refuses, warnings for what it ignores, and every row documented.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/config_checks.h"
#include "engine/config/config_support.h"

using namespace tessera;
using namespace tessera::testing;
using nlohmann::json;

// ---- issue 10: keys the engine does not act on yet -------------------------------------------

TEST_CASE("engine support: the offload configs run - only offload_param.pin_memory is named, as a warning") {
  auto issues_of = [](const std::string& name) {
    Checked c = check(read_text_file(TESSERA_SOURCE_DIR "/configs/" + name), 8);
    REQUIRE(c.report.ok());
    return engine_support_issues(c.config);
  };
  // ZeRO-Offload: optimizer and parameters to CPU memory, pinned (the optimizer's host buffers on
  // GPU ranks are pinned by it; parameter offload runs on CPU ranks, which need no pinning).
  auto zero3 = issues_of("zero3_offload_cpu.json");
  INFO(all_lines(zero3));
  CHECK(zero3.size() == 1);
  const ConfigIssue* pinned = find_issue(zero3, "zero_optimization.offload_param.pin_memory");
  REQUIRE(pinned);
  CHECK(pinned->severity == ConfigIssue::Severity::Warning);
  // Stage 3 itself runs, and save_16bit_model always gathers its weights.
  CHECK(find_issue(zero3, "zero_optimization.stage") == nullptr);
  CHECK(find_issue(zero3, "zero_optimization.stage3_gather_16bit_weights_on_model_save") == nullptr);

  // ZeRO-Infinity: both to NVMe (offload/optimizer_swapper.h, offload/parameter_swapper.h).
  // A partial ratio splits the step between the device and the CPU: on CPU ranks both are host
  // memory, so it runs as it is (the engine's training is the same).
  Checked partial = check(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3,
                              "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})", 8);
  REQUIRE(partial.report.ok());
  CHECK(engine_support_issues(partial.config).empty());

  auto infinity = issues_of("zero3_nvme_infinity.json");
  INFO(all_lines(infinity));
  CHECK(infinity.empty());

  auto tp_pp = issues_of("tp2_pp2_zero1.json");
  INFO(all_lines(tp_pp));
  CHECK(tp_pp.empty());  // tensor parallelism and pipeline stages run (PipelineEngine, tessera.pipe)

  auto onebit = issues_of("onebit_adam.json");
  INFO(all_lines(onebit));
  CHECK(onebit.empty());  // 1-bit Adam runs (optim/onebit.h)
}

TEST_CASE("engine support: every other shipped config runs without a word") {
  const std::set<std::string> warned = {"zero3_offload_cpu.json"};  // pin_memory (above)
  int runnable = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TESSERA_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().filename().string();
    INFO(name);
    Checked c = check(read_text_file(entry.path().string()), 8);
    REQUIRE(c.report.ok());
    auto issues = engine_support_issues(c.config);
    INFO(all_lines(issues));
    if (warned.count(name)) {
      CHECK(std::none_of(issues.begin(), issues.end(),
                         [](const ConfigIssue& i) { return i.severity == ConfigIssue::Severity::Error; }));
    } else {
      CHECK(issues.empty());
      ++runnable;
    }
  }
  CHECK(runnable >= 9);
}

TEST_CASE("engine support: a key the engine does not read is named unless it keeps DeepSpeed's default") {
  Checked c = check(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"torch_adam": true}},
    "zero_optimization": {"stage": 2, "contiguous_gradients": false, "reduce_scatter": false,
                          "allgather_partitions": false, "round_robin_gradients": true,
                          "load_from_fp32_weights": false, "stage3_model_persistence_threshold": 1e8,
                          "offload_param": {"pin_memory": true}},
    "activation_checkpointing": {"partition_activations": true, "number_checkpoints": 4},
    "checkpoint": {"tag_validation": "Fail", "parallel_write": {"pipeline_stage": true}, "load_universal": true},
    "aio": {"queue_depth": 16}, "pipeline": {"partition_method": "uniform", "activation_checkpoint_interval": 2},
    "tensorboard": {"enabled": true}, "comms_logger": {"enabled": true}, "flops_profiler": {"enabled": true}})");
  // (the monitors, the comms logger and the flops profiler are acted on: docs/monitoring.md)
  REQUIRE(c.report.ok());
  auto issues = engine_support_issues(c.config);
  INFO(all_lines(issues));
  const char* expected[] = {"optimizer.params.torch_adam",
                            "zero_optimization.stage3_model_persistence_threshold",
                            "zero_optimization.offload_param.pin_memory"};
  CHECK(issues.size() == std::size(expected));
  for (const char* path : expected) {
    INFO(path);
    const ConfigIssue* i = find_issue(issues, path);
    REQUIRE(i);
    CHECK(i->severity == ConfigIssue::Severity::Warning);
    CHECK(contains(i->message, "not implemented yet: found "));
  }
  CHECK(find_issue(issues, "optimizer.params.torch_adam")->str() ==
        "warning: optimizer.params.torch_adam: not implemented yet: found true; the engine runs its own Adam on flat "
        "shards");
  // The checkpoint keys are acted on (docs/checkpoints.md), except node-local storage: refused.
  for (const char* key : {"zero_optimization.load_from_fp32_weights", "checkpoint.tag_validation",
                          "checkpoint.parallel_write.pipeline_stage", "checkpoint.load_universal"})
    CHECK(find_issue(issues, key) == nullptr);
  Checked local = check(R"({"train_batch_size": 8, "optimizer": {"type": "Adam"},
    "checkpoint": {"use_node_local_storage": true}})");
  REQUIRE(local.report.ok());
  auto refused = engine_support_issues(local.config);
  REQUIRE(find_issue(refused, "checkpoint.use_node_local_storage"));
  CHECK(find_issue(refused, "checkpoint.use_node_local_storage")->severity == ConfigIssue::Severity::Error);
  // The ZeRO keys the engine acts on or accepts (docs/config.md) are not named.
  for (const char* key : {"zero_optimization.contiguous_gradients", "zero_optimization.reduce_scatter",
                          "zero_optimization.allgather_partitions", "zero_optimization.round_robin_gradients"})
    CHECK(find_issue(issues, key) == nullptr);

  // The same keys set to DeepSpeed's defaults (overlap_comm: the default for the stage) change nothing.
  for (const char* text : {
           R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"torch_adam": false}},
               "zero_optimization": {"stage": 2, "contiguous_gradients": true, "overlap_comm": false,
                                     "reduce_scatter": true, "allgather_partitions": true,
                                     "round_robin_gradients": false, "stage3_max_live_parameters": 1e9,
                                     "sub_group_size": 1e9, "offload_optimizer": {"device": "none", "ratio": 1.0}},
               "activation_checkpointing": {"partition_activations": false, "number_checkpoints": null},
               "checkpoint": {"tag_validation": "Warn"}, "aio": {"queue_depth": 8, "block_size": 1048576},
               "pipeline": {"stages": 1, "partition_method": "parameters"},
               "tensorboard": {"enabled": false, "output_path": "tb"}, "comms_logger": {"enabled": false}})",
           // overlap_comm true: the parameter allgather overlaps the next forward (stages 1-2)
           R"({"train_batch_size": 8, "optimizer": {"type": "SGD"},
               "zero_optimization": {"stage": 1, "overlap_comm": true}})",
       }) {
    Checked d = check(text);
    REQUIRE(d.report.ok());
    auto none = engine_support_issues(d.config);
    INFO(text << "\n" << all_lines(none));
    CHECK(none.empty());
  }
}

TEST_CASE("engine support: a config without an optimizer section is an error") {
  Checked c = check(R"({"train_batch_size": 8})");
  REQUIRE(c.report.ok());
  auto issues = engine_support_issues(c.config);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].str() == "error: optimizer: missing; the engine builds the optimizer from this section (from "
                           "Python, tessera.initialize(optimizer=...) stands for it: a torch.optim Adam, AdamW or SGD "
                           "becomes this section, and any other torch optimizer runs as given over the flat shards)");
  // A client optimizer run as given stands for the section: nothing is missing, nothing is flagged.
  ParseOptions client;
  client.client_optimizer = ClientOptimizerInfo{"torch.optim.RMSprop", 0.01};
  Checked with_client = check(R"({"train_batch_size": 8})", 1, client);
  REQUIRE(with_client.report.ok());
  CHECK(engine_support_issues(with_client.config).empty());
  // An optimizer section that failed to parse is its own error, not a missing one.
  Checked bad = check(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": "fast"}}})");
  add_engine_support_issues(bad.config, bad.report);
  INFO(bad.report.errors());
  CHECK(error_count(bad.report) == 1);
  CHECK(has_error(bad.report, "optimizer.params.lr", "expected a number"));
}

TEST_CASE("engine support: every row of the table is a key of the config and is in docs/config.md") {
  std::ifstream in(TESSERA_SOURCE_DIR "/docs/config.md");
  std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Config adam, onebit;
  adam.optimizer.emplace(), adam.optimizer->type = "Adam";
  onebit.optimizer.emplace(), onebit.optimizer->type = "OneBitAdam";
  json keys = config_to_json(adam);
  keys["optimizer"]["params"].update(config_to_json(onebit)["optimizer"]["params"]);
  for (const auto& row : unimplemented_keys()) {
    std::string path = row.path;
    INFO(path);
    CHECK(contains(docs, "`" + path + "`"));
    bool pattern = path.back() == '*';
    std::string section = pattern ? path.substr(0, path.rfind('.')) : path;
    std::string pointer_text = "/" + section;
    std::replace(pointer_text.begin(), pointer_text.end(), '.', '/');
    json::json_pointer pointer(pointer_text);
    REQUIRE(keys.contains(pointer));
    if (pattern) {
      std::string prefix = path.substr(section.size() + 1, path.size() - section.size() - 2);
      bool any = false;
      for (const auto& item : keys[pointer].items()) any = any || item.key().rfind(prefix, 0) == 0;
      CHECK(any);
    }
  }
}

TEST_CASE("tessera config check names the keys the engine does not act on yet") {
  TempDir dir;
  std::string partial = dir.file("partial.json");
  std::ofstream(partial) << R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3,
                               "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}, "aio": {"use_gds": true}})";
  auto refused = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", partial});
  INFO(refused.output);
  CHECK(refused.status == 1);
  CHECK_FALSE(contains(refused.output, "zero_optimization.stage:"));  // stage 3 runs
  CHECK(contains(refused.output, "error: aio.use_gds: not implemented yet"));
  CHECK(contains(refused.output, "partial.json: 1 error"));

  std::string warned = dir.file("warned.json");
  std::ofstream(warned) << R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
                               "zero_optimization": {"stage": 2}, "aio": {"overlap_events": false}})";
  auto ok = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", warned});
  INFO(ok.output);
  CHECK(ok.status == 0);
  CHECK(contains(ok.output, "warning: aio.overlap_events: not implemented yet: found false"));
  CHECK_FALSE(contains(ok.output, "warning: warning:"));
  CHECK(contains(ok.output, "\"aio\": {"));  // the effective config still follows

  std::string no_optimizer = dir.file("no_optimizer.json");
  std::ofstream(no_optimizer) << R"({"train_batch_size": 8})";
  auto missing = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", no_optimizer});
  CHECK(missing.status == 1);
  CHECK(contains(missing.output, "error: optimizer: missing; the engine builds the optimizer from this section"));
}

