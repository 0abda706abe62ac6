// What the config tests share (tests/engine/config/test_config.cpp, tests/engine/config/test_config_support.cpp): a config
// checked as load_config and `tessera config check` do, and readers of its issues.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config_io.h"
#include "subprocess.h"

namespace tessera::testing {

struct Checked {
  Config config;
  ResolvedLayout layout;
  ConfigReport report;
};

// What load_config and `tessera config check` do: parse, then resolve (after parse errors too).
inline Checked check(const std::string& text, int world_size = 1, const ParseOptions& options = {}) {
  Checked c;
  if (auto j = parse_json_text(text, "test config", c.report))
    c.config = parse_and_resolve_config(*j, world_size, c.report, &c.layout, options);
  return c;
}

inline const ConfigIssue* find_issue(const std::vector<ConfigIssue>& issues, const std::string& path) {
  for (const auto& i : issues)
    if (i.path == path) return &i;
  return nullptr;
}

inline std::string all_lines(const std::vector<ConfigIssue>& issues) {
  std::string out;
  for (const auto& i : issues) out += i.str() + "\n";
  return out;
}

inline std::string error_of_load(const std::string& path_or_json, int world_size = 1) {
  try {
    load_config(path_or_json, world_size);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}


inline int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

inline bool has_error(const ConfigReport& r, const std::string& path, const std::string& part) {
  for (const auto& i : r.issues)
    if (i.severity == ConfigIssue::Severity::Error && i.path == path && contains(i.message, part)) return true;
  return false;
}

inline int error_count(const ConfigReport& r) {
  int n = 0;
  for (const auto& i : r.issues) n += i.severity == ConfigIssue::Severity::Error;
  return n;
}

}  // namespace tessera::testing
