// `tessera config check FILE [--world-size N] [--unknown-keys warn] [--plan REQUEST]`: prints the effective config
// ("auto" layout keys chosen by the planner first, engine/planner/auto_layout.h)
// with every default filled in (exit 0), or every error with its JSON path (exit 1). Besides the
// config's own errors, it names the keys the engine does not act on yet (engine/config/config_support.h):
// warnings, or errors where the engine refuses the config (ZeRO-3, offload, tensor or pipeline
// parallelism, 1-bit Adam, no optimizer section). Warnings and errors go to stderr, the
// effective config to stdout.
#include <cstdio>
#include <iostream>

#include "engine/cli/commands.h"
#include "engine/config/config_io.h"
#include "engine/config/config_support.h"
#include "engine/planner/auto_layout.h"

namespace tessera {

namespace {

int check_config(const std::string& file, int world_size, const std::string& unknown_keys, const std::string& plan) {
  ConfigReport report;
  std::string text;
  try {
    text = read_text_file(file);
  } catch (const ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  auto json = parse_json_text(text, "'" + file + "'", report);
  if (json && planner::has_auto_layout(*json)) {
    // "auto" layout keys: the planner chooses them for this world (engine/planner/auto_layout.h).
    try {
      nlohmann::json request = nlohmann::json::object();
      if (!plan.empty()) {
        ConfigReport plan_report;
        auto parsed = parse_json_text(plan.front() == '{' ? plan : read_text_file(plan), "--plan", plan_report);
        if (!parsed) throw std::invalid_argument(plan_report.errors());
        request = *parsed;
      }
      const planner::AutoLayout resolved = planner::resolve_auto_layout(*json, world_size, request);
      std::cerr << resolved.line << "\n";
      json = resolved.config;
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << (plan.empty() ? " (--plan gives the planner the model and hardware)" : "")
                << "\n";
      return 1;
    }
  }
  Config config;
  ResolvedLayout layout;
  if (json) {
    ParseOptions options;
    if (!unknown_keys.empty()) options.unknown_keys = unknown_keys;
    config = parse_and_resolve_config(*json, world_size, report, &layout, options);
    add_engine_support_issues(config, report);
  }
  std::cerr << report.warnings();
  if (!report.ok()) {
    std::cerr << report.errors();
    int n = 0;
    for (const auto& i : report.issues) n += i.severity == ConfigIssue::Severity::Error;
    std::cerr << file << ": " << n << " error" << (n == 1 ? "" : "s") << "\n";
    return 1;
  }
  nlohmann::json out = config_to_json(config);
  out["tessera_layout"] = {{"world_size", layout.world_size},
                           {"data_parallel_size", layout.data},
                           {"tensor_parallel_size", layout.tensor},
                           {"pipeline_parallel_size", layout.pipe}};
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace

void register_config_command(CLI::App& app, int& exit_code) {
  auto* config = app.add_subcommand("config", "Work with DeepSpeed-compatible training configs");
  config->require_subcommand(1);
  auto* check = config->add_subcommand(
      "check", "Print the effective config with every default filled in, or all errors; name the keys the engine "
               "does not act on yet");
  struct Args {
    std::string file;
    int world_size = 1;
    std::string unknown_keys;
    std::string plan;
  };
  auto args = std::make_shared<Args>();
  check->add_option("file", args->file, "the JSON config")->required();
  check->add_option("--world-size", args->world_size, "number of ranks the config will run on (default 1)")
      ->check(CLI::PositiveNumber);
  check->add_option("--unknown-keys", args->unknown_keys, "override the config's unknown_keys switch")
      ->check(CLI::IsMember({"error", "warn"}));
  check->add_option("--plan", args->plan,
                    "\"auto\" layout keys: the model and hardware for the planner, a plan request as JSON text or a file "
                    "('{\"preset\": \"gpt2-small\", \"gpu_mem\": 40}'; docs/planner.md)");
  check->callback(
      [args, &exit_code] { exit_code = check_config(args->file, args->world_size, args->unknown_keys, args->plan); });
}

}  // namespace tessera
