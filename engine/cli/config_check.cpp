// `tessera config check FILE [--world-size N] [--unknown-keys warn]`: prints the effective config
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

namespace tessera {

namespace {

int check_config(const std::string& file, int world_size, const std::string& unknown_keys) {
  ConfigReport report;
  std::string text;
  try {
    text = read_text_file(file);
  } catch (const ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  auto json = parse_json_text(text, "'" + file + "'", report);
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
  };
  auto args = std::make_shared<Args>();
  check->add_option("file", args->file, "the JSON config")->required();
  check->add_option("--world-size", args->world_size, "number of ranks the config will run on (default 1)")
      ->check(CLI::PositiveNumber);
  check->add_option("--unknown-keys", args->unknown_keys, "override the config's unknown_keys switch")
      ->check(CLI::IsMember({"error", "warn"}));
  check->callback([args, &exit_code] { exit_code = check_config(args->file, args->world_size, args->unknown_keys); });
}

}  // namespace tessera
