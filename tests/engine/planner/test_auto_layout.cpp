// "auto" layout keys (engine/planner/auto_layout.h): resolved by the planner with the rest of the
// config fixed, the same way by C++, `tessera config check --plan` and train_gpt, whose training
// with the resolved config equals training with the values written out.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <string>

#include "engine/config/config_io.h"
#include "engine/planner/auto_layout.h"
#include "engine/planner/planner.h"
#include "tests/example_runs.h"
#include "tests/subprocess.h"

using namespace tessera;
using namespace tessera::planner;
using nlohmann::json;
using tessera::testing::contains;

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
