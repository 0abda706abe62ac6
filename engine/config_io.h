// Reading, checking and printing the training config.
//
//   parse_config      JSON -> Config, checking every key's type and range, unknown keys
//                     ("did you mean"), keys DeepSpeed knows that tessera does not implement,
//                     and "auto" placeholders. Every problem is reported, each with its JSON path.
//   resolve_config    fills what depends on the world size (the parallel degrees, the batch triple,
//                     overlap_comm) and reports contradictions between keys.
//   config_to_json    the effective config, every default filled in.
//   load_config       all three for a file or JSON text; throws ConfigError listing every error.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/config.h"

namespace tessera {

struct ConfigIssue {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  std::string path;     // JSON path of the offending key, "zero_optimization.offload_param.device"
  std::string message;  // what was found and what is allowed
  std::string str() const;
};

struct ConfigReport {
  std::vector<ConfigIssue> issues;
  void error(std::string path, std::string message);
  void warning(std::string path, std::string message);
  bool ok() const;              // no errors (warnings allowed)
  std::string errors() const;   // one line per error
  std::string warnings() const; // one line per warning
};

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

struct ParseOptions {
  // Overrides the config's own "unknown_keys" switch when set ("error" or "warn").
  std::optional<std::string> unknown_keys;
};

// Parallel degrees and batch sizes once the world size is known.
struct ResolvedLayout {
  int world_size = 1;
  int tensor = 1;
  int pipe = 1;
  int data = 1;
};

Config parse_config(const nlohmann::json& j, ConfigReport& report, const ParseOptions& options = {});

// Parses JSON text (comments allowed, duplicate keys are errors); `source` names it in messages.
std::optional<nlohmann::json> parse_json_text(const std::string& text, const std::string& source,
                                              ConfigReport& report);

ResolvedLayout resolve_config(Config& config, int world_size, ConfigReport& report);

nlohmann::json config_to_json(const Config& config);

// `path_or_json` is a file path, or JSON text if it starts with '{'. Throws ConfigError with every
// error; warnings are returned through `warnings` when given.
Config load_config(const std::string& path_or_json, int world_size, ResolvedLayout* layout = nullptr,
                   std::vector<std::string>* warnings = nullptr, const ParseOptions& options = {});

std::string read_text_file(const std::string& path);  // throws ConfigError naming the path

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace tessera
