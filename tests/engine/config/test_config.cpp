// The DeepSpeed-compatible config: shipped configs, defaults, derivation, and bad configs whose
// errors must name the JSON path.
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <tuple>

#include "engine/config/config_io.h"
#include "tests/config_checks.h"
#include "tests/subprocess.h"

using namespace tessera;
using nlohmann::json;
using namespace tessera::testing;


TEST_CASE("every shipped config in configs/ is valid") {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TESSERA_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    INFO(entry.path().string());
    for (int world : {4, 8}) {
      Checked c = check(read_text_file(entry.path().string()), world);
      INFO(c.report.errors());
      CHECK(c.report.ok());
      CHECK(c.report.warnings().empty());
    }
  }
  CHECK(files >= 10);
}

TEST_CASE("defaults are DeepSpeed's") {
  Checked c = check(R"({"train_micro_batch_size_per_gpu": 2})");
  REQUIRE(c.report.ok());
  const Config& k = c.config;
  CHECK(k.fp16.enabled == false);
  CHECK(k.fp16.loss_scale == 0);
  CHECK(k.fp16.initial_scale_power == 16);
  CHECK(k.fp16.loss_scale_window == 1000);
  CHECK(k.fp16.hysteresis == 2);
  CHECK(k.fp16.consecutive_hysteresis == false);
  CHECK(k.fp16.min_loss_scale == 1);
  CHECK(k.gradient_clipping == 0);
  CHECK(k.steps_per_print == 10);
  CHECK(k.zero_optimization.stage == 0);
  CHECK(k.zero_optimization.contiguous_gradients);
  CHECK(k.zero_optimization.reduce_scatter);
  CHECK(k.zero_optimization.reduce_bucket_size == 500000000);
  CHECK(k.zero_optimization.allgather_bucket_size == 500000000);
  CHECK(k.zero_optimization.overlap_comm == false);  // resolved: true only for stage 3
  CHECK(k.zero_optimization.sub_group_size == 1000000000);
  CHECK(k.zero_optimization.stage3_prefetch_bucket_size == 50000000);
  CHECK(k.zero_optimization.stage3_param_persistence_threshold == 100000);
  CHECK(k.zero_optimization.offload_optimizer.buffer_count == 4);
  CHECK(k.zero_optimization.offload_param.buffer_count == 5);
  CHECK(k.zero_optimization.offload_param.buffer_size == 100000000);
  CHECK(k.aio.block_size == 1048576);
  CHECK(k.aio.queue_depth == 8);
  CHECK(k.aio.overlap_events);
  CHECK(k.csv_monitor.job_name == "DeepSpeedJobName");
  CHECK(k.comms_logger.prof_all);
  CHECK(k.train_batch_size == 2);
  CHECK(k.gradient_accumulation_steps == 1);
  CHECK(check(R"({"train_batch_size": 2, "zero_optimization": {"stage": 3}})").config.zero_optimization.overlap_comm == true);
}

TEST_CASE("scheduler and optimizer defaults follow the type") {
  Checked c = check(R"({"train_batch_size": 4, "optimizer": {"type": "adamw"},
                        "scheduler": {"type": "warmupcosinelr", "params": {"total_num_steps": 2000}}})");
  REQUIRE(c.report.ok());
  CHECK(c.config.optimizer->type == "AdamW");
  CHECK(c.config.optimizer->params.lr == 1e-3);
  CHECK(c.config.optimizer->params.betas == std::vector<double>{0.9, 0.999});
  CHECK(c.config.optimizer->params.adam_w_mode);
  CHECK(c.config.scheduler->type == "WarmupCosineLR");
  CHECK(c.config.scheduler->params.cos_min_ratio == 1e-4);
  CHECK(c.config.scheduler->params.warmup_num_steps == 1000);
  CHECK(c.config.scheduler->params.warmup_type == "log");
}

TEST_CASE("the batch triple: any two give the third against the data-parallel size") {
  auto c = check(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 4);
  REQUIRE(c.report.ok());
  CHECK(c.config.gradient_accumulation_steps == 2);
  c = check(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4);
  CHECK(c.config.train_micro_batch_size_per_gpu == 4);
  c = check(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 4);
  CHECK(c.config.train_batch_size == 32);
  // tensor and pipeline ranks do not multiply the batch: dp = 8 / (2 * 2) = 2
  c = check(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
               "tensor_parallel": {"tp_size": 2}, "pipeline": {"stages": 2}})", 8);
  REQUIRE(c.report.ok());
  CHECK(c.layout.data == 2);
  CHECK(c.config.train_batch_size == 16);
  CHECK(c.config.pipeline.micro_batches == 2);
}

TEST_CASE("an inconsistent batch triple shows the arithmetic") {
  auto c = check(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 2);
  CHECK(has_error(c.report, "train_batch_size",
                  "train_batch_size 32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x "
                  "data-parallel size 2 (= 16)"));
  c = check(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 2);
  CHECK(has_error(c.report, "train_batch_size", "not divisible by train_micro_batch_size_per_gpu 4 x data-parallel size 2 (= 8)"));
  c = check(R"({"gradient_accumulation_steps": 2})", 2);
  CHECK(has_error(c.report, "train_batch_size", "either train_batch_size or train_micro_batch_size_per_gpu"));
}

TEST_CASE("bad configs: every error names its JSON path") {
  struct Case {
    const char* text;
    const char* path;
    const char* message;
  };
  const Case cases[] = {
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})", "zero_optimization.stage",
       "found 4, expected a value in [0, 3]"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})",
       "zero_optimization.offload_optimizer.device", R"(found "gpu", expected one of "none", "cpu", "nvme")"},
      {R"({"train_batch_sise": 8})", "train_batch_sise", R"(unknown key; did you mean "train_batch_size"?)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_sise": 5}})",
       "zero_optimization.reduce_bucket_sise", R"(did you mean "reduce_bucket_size"?)"},
      {R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})", "bf16.enabled",
       "fp16.enabled and bf16.enabled are both true"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       "zero_optimization.offload_param.device", "offload_param needs ZeRO stage 3"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
          "nvme_path": "/tmp", "ratio": 0.5}}})",
       "zero_optimization.offload_optimizer.ratio", R"(it needs offload_optimizer.device "cpu" (found "nvme"))"},
      {R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "bf16"}})", "data_types.grad_accum_dtype",
       "needs bf16 compute (bf16.enabled true)"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
          "data_types": {"grad_accum_dtype": "bf16"}})",
       "data_types.grad_accum_dtype", "applies at ZeRO stage 0 or 1"},
      {R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp16"}})", "data_types.grad_accum_dtype",
       R"(expected one of "fp32", "bf16")"},
      {R"({"train_batch_size": 8, "communication_data_type": "int8"})", "communication_data_type",
       R"(expected one of "fp32", "fp16", "bf16")"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
       "zero_optimization.offload_optimizer.device", "offload_optimizer needs ZeRO stage 1, 2 or 3"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
       "zero_optimization.offload_optimizer.nvme_path", "needs nvme_path"},
      {R"({"train_batch_size": 8, "gradient_clipping": "auto"})", "gradient_clipping",
       "\"auto\" is a placeholder that Hugging Face's Trainer fills in"},
      {R"({"train_micro_batch_size_per_gpu": "auto"})", "train_batch_size",
       "\"auto\", Hugging Face's placeholder, counts as unset"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adamax"}})", "optimizer.type",
       R"(expected one of "Adam", "AdamW", "SGD", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb")"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})",
       "optimizer.params.max_grad_norm", "use the top-level \"gradient_clipping\""},
      {R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
       "optimizer.params.betas", "unknown key"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
       "optimizer.params.betas", "two numbers in [0, 1)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"cpu_offload": true}})", "zero_optimization.cpu_offload",
       "DeepSpeed knows this key but tessera does not implement it: renamed by DeepSpeed"},
      {R"({"train_batch_size": 8, "steps_per_print": "10"})", "steps_per_print", R"(found "10", expected an integer)"},
      {R"({"train_batch_size": 8, "fp16": {"enabled": "true"}})", "fp16.enabled", "expected true or false"},
      {R"({"train_batch_size": 8, "fp16": true})", "fp16", "expected an object"},
      {R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 2.5}})",
       "zero_optimization.reduce_bucket_size", "expected an integer"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}})",
       "scheduler.params.total_num_steps", "WarmupDecayLR needs total_num_steps"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})",
       "scheduler.params.cycle_min_lr", "OneCycle needs cycle_min_lr"},
      {R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 3}})", "tensor_parallel.tp_size",
       "world size 2 is not divisible by tensor_parallel.tp_size (3) x pipeline.stages (1) = 3"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", "bfloat16",
       "both \"bf16\" and its alias \"bfloat16\" are set"},
      {R"({"train_batch_size": 8, "pipeline": {"partition_method": "balanced"}})", "pipeline.partition_method",
       R"(expected "parameters", "uniform" or "type:<regex>")"},
      {R"({"train_batch_size": 8, "pipeline": {"stages": "auto"}})", "pipeline.stages", "\"auto\" is a placeholder"},
      {R"({"train_batch_size": 8, "pipeline": {"schedule": "interleaved"}})", "pipeline.schedule", "\"1f1b\""},
      {R"({"train_batch_size": 8, "fp16": {"enabled": true, "min_loss_scale": 1024, "initial_scale_power": 8}})",
       "fp16.min_loss_scale", "above the initial scale 2^8"},
      {R"({"train_batch_size": 8, "train_batch_size": 16})", "train_batch_size", "duplicate key"},
      {R"({"train_batch_size": 8, "csv_monitor": {"enabled": true, "outpt_path": "x"}})", "csv_monitor.outpt_path",
       R"(did you mean "output_path"?)"},
  };
  for (const auto& k : cases) {
    auto c = check(k.text, 2);
    INFO(k.text << "\n" << c.report.errors());
    CHECK(has_error(c.report, k.path, k.message));
  }
}

TEST_CASE("every problem is reported in one pass") {
  auto c = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 7, "overlap_com": true},
                     "fp16": {"enabled": 1}, "steps_per_prnt": 5})");
  CHECK(error_count(c.report) == 4);
  CHECK(has_error(c.report, "zero_optimization.stage", "expected a value in [0, 3]"));
  CHECK(has_error(c.report, "zero_optimization.overlap_com", "did you mean \"overlap_comm\""));
  CHECK(has_error(c.report, "fp16.enabled", "expected true or false"));
  CHECK(has_error(c.report, "steps_per_prnt", "did you mean \"steps_per_print\""));
}

TEST_CASE("unknown_keys: warn downgrades unknown and unsupported keys to warnings") {
  auto c = check(R"({"unknown_keys": "warn", "train_batch_size": 8, "nebula": {"enabled": true}, "my_own_key": 1})");
  CHECK(c.report.ok());
  CHECK(contains(c.report.warnings(), "nebula"));
  CHECK(contains(c.report.warnings(), "my_own_key"));
}

TEST_CASE("invalid JSON is reported with line and column") {
  auto c = check("{\n  \"train_batch_size\": 8,\n  \"fp16\": {enabled: true}\n}");
  REQUIRE_FALSE(c.report.ok());
  CHECK(contains(c.report.errors(), "line 3"));
}

TEST_CASE("comments are allowed as in DeepSpeed's hjson") {
  auto c = check("{\n  // the global batch\n  \"train_batch_size\": 8 /* eight */\n}");
  CHECK(c.report.ok());
}

TEST_CASE("the effective config parses back to itself") {
  auto c = check(read_text_file(TESSERA_SOURCE_DIR "/configs/zero3_nvme_infinity.json"), 2);
  REQUIRE(c.report.ok());
  json effective = config_to_json(c.config);
  auto again = check(effective.dump(), 2);
  INFO(again.report.errors());
  REQUIRE(again.report.ok());
  CHECK(config_to_json(again.config) == effective);
  CHECK(effective["zero_optimization"]["offload_param"]["nvme_path"] == "/tmp/tessera_nvme");
  CHECK(effective["aio"]["queue_depth"] == 8);
}

TEST_CASE("load_config throws one error listing every problem") {
  try {
    load_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 9}, "fp16": {"hysteresis": 0}})", 1);
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(contains(e.what(), "zero_optimization.stage"));
    CHECK(contains(e.what(), "fp16.hysteresis"));
  }
}

TEST_CASE("Hugging Face style DeepSpeed configs get clear errors for every auto value") {
  auto c = check(read_text_file(TESSERA_SOURCE_DIR "/tests/data/hf_trainer_zero2.json"), 2);
  CHECK(has_error(c.report, "train_batch_size", "\"auto\""));
  CHECK(has_error(c.report, "optimizer.params.lr", "\"auto\""));
  CHECK(has_error(c.report, "scheduler.params.warmup_num_steps", "\"auto\""));
  CHECK(has_error(c.report, "zero_optimization.reduce_bucket_size", "\"auto\""));
  CHECK(!has_error(c.report, "train_micro_batch_size_per_gpu", ""));  // counted as unset, not a type error
}

TEST_CASE("auto batch sizes are resolved from the other two and the data-parallel size") {
  auto c = check(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"})", 2);
  INFO(c.report.errors());
  CHECK(c.report.ok());
  CHECK(*c.config.gradient_accumulation_steps == 4);
  auto d = check(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 4);
  CHECK(d.report.ok());
  CHECK(*d.config.train_batch_size == 24);
}

TEST_CASE("a DeepSpeed key tessera lacks is accepted at DeepSpeed's default, refused otherwise by name") {
  auto quiet = check(R"({"train_batch_size": 8, "sparse_gradients": false, "zero_allow_untested_optimizer": false,
    "zero_optimization": {"stage": 1, "cpu_offload": false, "elastic_checkpoint": false},
    "fp16": {"enabled": true, "fp16_master_weights_and_grads": false, "auto_cast": false},
    "autotuning": {"enabled": false, "arg_mappings": {"x": "y"}}, "flops_profiler": {"enabled": false, "profile_step": 1},
    "progressive_layer_drop": {"enabled": false}, "data_efficiency": {}, "wandb": {"enabled": false}})", 2);
  INFO(quiet.report.errors());
  CHECK(quiet.report.ok());
  INFO(all_lines(quiet.report.issues));
  CHECK(all_lines(quiet.report.issues).find("autotuning") == std::string::npos);
  CHECK(all_lines(quiet.report.issues).find("does not implement") == std::string::npos);
  for (const auto& [text, path, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"("autotuning": {"enabled": true})", "autotuning", "DeepSpeed's autotuner (autotuning) is outside tessera's scope"},
           {R"("progressive_layer_drop": {"enabled": true, "theta": 0.5})", "progressive_layer_drop", "progressive layer drop"},
           {R"("compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true}}})",
            "compression_training", "compression library"},
           {R"("data_efficiency": {"enabled": true})", "data_efficiency", "data efficiency library"},
           {R"("sparse_attention": {"mode": "fixed"})", "sparse_attention", "sparse attention kernels"},
           {R"("zero_optimization": {"cpu_offload": true})", "zero_optimization.cpu_offload", "renamed by DeepSpeed"}}) {
    auto c = check(R"({"train_batch_size": 8, )" + text + "}", 2);
    INFO(text << "\n" << c.report.errors());
    CHECK(has_error(c.report, path, message));
  }
}

TEST_CASE("a client torch optimizer stands for the optimizer section - ZeRO needs zero_allow_untested_optimizer") {
  ParseOptions client;
  client.client_optimizer = ClientOptimizerInfo{"torch.optim.Adagrad", 0.05};
  auto stage0 = check(R"({"train_batch_size": 8})", 2, client);
  INFO(stage0.report.errors());
  REQUIRE(stage0.report.ok());
  REQUIRE(stage0.config.optimizer);
  CHECK(stage0.config.optimizer->client);
  CHECK(stage0.config.optimizer->type == "torch.optim.Adagrad");
  CHECK(stage0.config.optimizer->params.lr == 0.05);
  const json effective = config_to_json(stage0.config)["optimizer"];  // the type and lr, no Adam settings
  CHECK(effective == json::parse(R"({"type": "torch.optim.Adagrad", "params": {"lr": 0.05}})"));

  auto zero2 = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})", 2, client);
  CHECK(has_error(zero2.report, "zero_allow_untested_optimizer", "set \"zero_allow_untested_optimizer\": true"));
  CHECK(has_error(zero2.report, "zero_allow_untested_optimizer", "torch.optim.Adagrad"));
  auto allowed = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": true})",
                       2, client);
  INFO(allowed.report.errors());
  CHECK(allowed.report.ok());
  auto nvme = check(R"({"train_batch_size": 8, "zero_allow_untested_optimizer": true, "zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})", 2, client);
  CHECK(has_error(nvme.report, "zero_optimization.offload_param.device", "client torch optimizer"));
  auto both = check(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 0.1}}})", 2, client);
  CHECK(has_error(both.report, "optimizer", "give the optimizer in one place"));
  // Without a client optimizer the key changes nothing, at either value (as in DeepSpeed).
  auto plain = check(R"({"train_batch_size": 8, "zero_allow_untested_optimizer": true,
    "optimizer": {"type": "Adam", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}})", 2);
  INFO(all_lines(plain.report.issues));
  CHECK(plain.report.ok());
  CHECK(plain.report.issues.empty());
}

TEST_CASE("tessera config check prints the effective config or every error") {
  auto ok = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", TESSERA_SOURCE_DIR "/configs/zero2_bf16.json",
                                   "--world-size", "2"});
  CHECK(ok.status == 0);
  json printed = json::parse(ok.output);
  CHECK(printed["train_batch_size"] == 16);
  CHECK(printed["fp16"]["initial_scale_power"] == 16);
  CHECK(printed["tessera_layout"]["data_parallel_size"] == 2);

  auto bad = tessera::testing::run({TESSERA_CLI_PATH, "config", "check",
                                    TESSERA_SOURCE_DIR "/tests/data/hf_trainer_zero2.json"});
  CHECK(bad.status == 1);
  CHECK(contains(bad.output, "error: train_batch_size: either train_batch_size or train_micro_batch_size_per_gpu"));
  CHECK(contains(bad.output, "counts as unset"));
  CHECK(contains(bad.output, "errors"));
}

// ---- issue 10: every error in one pass -------------------------------------------------------

TEST_CASE("a type error does not hide the errors found by resolution") {
  const std::string text = R"({"steps_per_print": "10",
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "fp16": {"enabled": true}, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})";
  std::string e = error_of_load(text, 2);
  INFO(e);
  CHECK(count_of(e, "error: ") == 4);
  CHECK(contains(e, "error: steps_per_print: found \"10\", expected an integer"));
  CHECK(contains(e, "error: train_batch_size: train_batch_size 32 != train_micro_batch_size_per_gpu 4"));
  CHECK(contains(e, "error: bf16.enabled: fp16.enabled and bf16.enabled are both true"));
  CHECK(contains(e, "error: zero_optimization.offload_param.device: offload_param needs ZeRO stage 3"));
}

TEST_CASE("the README's three-error example prints three errors") {
  const std::string text = R"({"train_batch_sise": 16, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})";
  const char* lines[] = {
      "error: zero_optimization.offload_param.device: offload_param needs ZeRO stage 3 (parameters are partitioned "
      "only there); zero_optimization.stage is 2\n",
      "error: train_batch_sise: unknown key; did you mean \"train_batch_size\"? (set \"unknown_keys\": \"warn\" to "
      "carry on regardless)\n",
      "error: gradient_clipping: \"auto\" is a placeholder that Hugging Face's Trainer fills in; "
      "tessera reads the config as written: set a number\n"};
  std::string e = error_of_load(text);
  INFO(e);
  CHECK(count_of(e, "error: ") == 3);
  for (const char* line : lines) CHECK(contains(e, line));

  TempDir dir;
  std::string file = dir.file("readme.json");
  std::ofstream(file) << text;
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", file});
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(count_of(r.output, "error: ") == 3);
  for (const char* line : lines) CHECK(contains(r.output, line));
  CHECK(contains(r.output, "readme.json: 3 errors"));
}

TEST_CASE("resolution skips the checks on keys that failed to parse: no second error about them") {
  // Each key below fails to parse; the checks that would read it (the batch triple, offload at
  // stage 0, the parallel degrees, WarmupDecayLR's total_num_steps) must not add a second error.
  auto c = check(R"({"train_batch_size": "32", "optimizer": {"type": "AdamW"},
                     "zero_optimization": {"stage": 7, "offload_optimizer": {"device": "cpu"}},
                     "tensor_parallel": {"tp_size": 0},
                     "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})", 2);
  INFO(c.report.errors());
  CHECK(error_count(c.report) == 4);
  CHECK(has_error(c.report, "train_batch_size", "found \"32\""));
  CHECK(has_error(c.report, "zero_optimization.stage", "found 7"));
  CHECK(has_error(c.report, "tensor_parallel.tp_size", "found 0"));
  CHECK(has_error(c.report, "scheduler.params.total_num_steps", "\"auto\""));
  // A check whose keys all parsed still runs next to a parse error elsewhere.
  auto d = check(R"({"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}, "bf16": {"enabled": true},
                     "scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})");
  INFO(d.report.errors());
  CHECK(error_count(d.report) == 3);
  CHECK(has_error(d.report, "fp16.hysteresis", "expected a value >= 1"));
  CHECK(has_error(d.report, "bf16.enabled", "both true"));
  CHECK(has_error(d.report, "scheduler.params.cycle_min_lr", "OneCycle needs cycle_min_lr"));
}

// ---- issue 10: messages ----------------------------------------------------------------------

TEST_CASE("load_config's warnings do not carry a second \"warning:\"") {
  std::vector<std::string> warnings;
  load_config(R"({"unknown_keys": "warn", "train_batch_size": 8, "nebula": {"enabled": true}})", 1, nullptr,
              &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].rfind("nebula: DeepSpeed knows this key but tessera does not implement it", 0) == 0);
  // Callers print them as "<program>: warning: <path>: <message>".
  CHECK_FALSE(contains("tessera: warning: " + warnings[0], "warning: warning:"));
}

TEST_CASE("ConfigError names inline text and files naturally") {
  std::string inline_error = error_of_load(R"({"train_batch_size": 0})");
  CHECK(inline_error.rfind("invalid config (inline JSON text):\nerror: train_batch_size: found 0", 0) == 0);
  CHECK(contains(error_of_load(R"({"train_batch_size": 8,})"),
                 "error: (top level): the inline JSON text is not valid JSON"));

  TempDir dir;
  std::string file = dir.file("bad.json");
  std::ofstream(file) << R"({"train_batch_size": 0})";
  CHECK(error_of_load(file).rfind("invalid config '" + file + "':\nerror: train_batch_size: found 0", 0) == 0);
}

TEST_CASE("a config file that cannot be read says why") {
  std::string e;
  try {
    read_text_file("/nonexistent/ds_config.json");
  } catch (const ConfigError& x) {
    e = x.what();
  }
  CHECK(e == "cannot read config file '/nonexistent/ds_config.json': No such file or directory");
  CHECK(contains(error_of_load("/nonexistent/ds_config.json"), "No such file or directory"));
  TempDir dir;
  CHECK(error_of_load(dir.path) == "cannot read config file '" + dir.path + "': Is a directory");
  auto r = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", "/nonexistent/ds_config.json"});
  CHECK(r.status == 1);
  CHECK(contains(r.output, "error: cannot read config file '/nonexistent/ds_config.json': No such file or directory"));
}

TEST_CASE("configs in the shapes of DeepSpeedExamples' are accepted or refused for a feature named") {
  const std::string folder = TESSERA_SOURCE_DIR "/tests/data/deepspeed_examples/";
  const json expected = json::parse(read_text_file(folder + "expected.json"));
  REQUIRE(expected.size() >= 10);
  for (const auto& [file, outcome] : expected.items()) {
    auto result = tessera::testing::run({TESSERA_CLI_PATH, "config", "check", folder + file});
    INFO(file << "\n" << result.output);
    if (outcome == "ok") {
      CHECK(result.status == 0);
      CHECK_FALSE(contains(result.output, "does not implement"));
    } else {
      CHECK(result.status == 1);
      for (const auto& error : outcome) {  // [JSON path, words of its message], and nothing else
        CHECK(contains(result.output, "error: " + error[0].get<std::string>() + ": "));
        CHECK(contains(result.output, error[1].get<std::string>()));
      }
      CHECK(contains(result.output, ": " + std::to_string(outcome.size()) + (outcome.size() == 1 ? " error" : " errors")));
    }
  }
}
