// Reading, checking and printing the training config.
//
//   parse_config      JSON -> Config, checking every key's type and range, unknown keys
//                     ("did you mean"), keys DeepSpeed knows that tessera does not implement,
//                     and "auto" placeholders. Every problem is reported, each with its JSON path.
//   resolve_config    fills what depends on the world size (the parallel degrees, the batch triple,
//                     overlap_comm) and reports contradictions between keys. It runs after parse
//                     errors too, skipping only the checks that involve a key that failed to parse,
//                     so every error shows in one pass and none is reported twice.
//   config_to_json    the effective config, every default filled in.
//   load_config       all three for a file or JSON text; throws ConfigError listing every error.
// What the engine can run of a valid config is engine/config/config_support.h.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace tessera {

struct ConfigIssue {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  std::string path;     // JSON path of the offending key, "zero_optimization.offload_param.device"
  std::string message;  // what was found and what is allowed
  std::string str() const;               // "error: <path>: <message>" or "warning: <path>: <message>"
  std::string path_and_message() const;  // "<path>: <message>", for callers that say the severity themselves
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

// A script's own torch optimizer (Python's tessera.initialize(optimizer=...), of a kind the engine
// does not have): it stands for the config's optimizer section, which must then be absent.
struct ClientOptimizerInfo {
  std::string type;  // its class, "torch.optim.Adagrad"
  double lr = 0;     // its first param group's learning rate (the schedule's base)
};

struct ParseOptions {
  // Overrides the config's own "unknown_keys" switch when set ("error" or "warn").
  std::optional<std::string> unknown_keys;
  std::optional<ClientOptimizerInfo> client_optimizer;
};

// Parallel degrees and batch sizes once the world size is known.
struct ResolvedLayout {
  int world_size = 1;
  int tensor = 1;
  int pipe = 1;
  int data = 1;
  int context = 1;
};

Config parse_config(const nlohmann::json& j, ConfigReport& report, const ParseOptions& options = {});

// Parses JSON text (comments allowed, duplicate keys are errors); `source` names it in messages.
std::optional<nlohmann::json> parse_json_text(const std::string& text, const std::string& source,
                                              ConfigReport& report);

// Checks that involve a key already in error in `report` (that key, or its section) are skipped.
ResolvedLayout resolve_config(Config& config, int world_size, ConfigReport& report);

// parse_config then resolve_config, as load_config and `tessera config check` do.
Config parse_and_resolve_config(const nlohmann::json& j, int world_size, ConfigReport& report,
                                ResolvedLayout* layout = nullptr, const ParseOptions& options = {});

// True when `report` has an error at `path`, at a section enclosing it, or inside it.
bool has_error_at(const ConfigReport& report, const std::string& path);

nlohmann::json config_to_json(const Config& config);

// `path_or_json` is a file path, or JSON text if it starts with '{'. Throws ConfigError with every
// error ("invalid config 'PATH':" or "invalid config (inline JSON text):", then one line per
// error); warnings are returned through `warnings` when given, each "<path>: <message>" (the
// caller says "warning").
// The keys the engine does not act on yet are not checked here: engine_support_issues().
Config load_config(const std::string& path_or_json, int world_size, ResolvedLayout* layout = nullptr,
                   std::vector<std::string>* warnings = nullptr, const ParseOptions& options = {});

// Throws ConfigError naming the path and the system's reason ("No such file or directory").
std::string read_text_file(const std::string& path);

// How messages name a config given as a file path or as inline JSON text (first character '{').
struct ConfigSource {
  bool inline_json = false;
  std::string name;     // "'PATH'" or "the inline JSON text": "... is not valid JSON", "duplicate key in ..."
  std::string heading;  // "'PATH'" or "(inline JSON text)": "invalid config (inline JSON text):"
};
ConfigSource config_source(const std::string& path_or_json);

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace tessera
