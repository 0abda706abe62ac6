// Parsing and printing of the config through each struct's `fields(v)` list (engine/config/config.h).
#include "engine/config/config_io.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "engine/config/config_visitor.h"

namespace tessera {

using nlohmann::json;

// ---- reports ---------------------------------------------------------------------------------

std::string ConfigIssue::path_and_message() const {
  return (path.empty() ? "(top level)" : path) + ": " + message;
}

std::string ConfigIssue::str() const {
  return (severity == Severity::Error ? "error: " : "warning: ") + path_and_message();
}

bool has_error_at(const ConfigReport& report, const std::string& path) {
  auto inside = [](const std::string& a, const std::string& b) {  // a lies inside section b
    return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
  };
  for (const auto& i : report.issues)
    if (i.severity == ConfigIssue::Severity::Error &&
        (i.path.empty() || i.path == path || inside(path, i.path) || inside(i.path, path)))
      return true;
  return false;
}

void ConfigReport::error(std::string path, std::string message) {
  issues.push_back({ConfigIssue::Severity::Error, std::move(path), std::move(message)});
}
void ConfigReport::warning(std::string path, std::string message) {
  issues.push_back({ConfigIssue::Severity::Warning, std::move(path), std::move(message)});
}
bool ConfigReport::ok() const {
  return std::none_of(issues.begin(), issues.end(),
                      [](const ConfigIssue& i) { return i.severity == ConfigIssue::Severity::Error; });
}
static std::string lines_of(const std::vector<ConfigIssue>& issues, ConfigIssue::Severity s) {
  std::string out;
  for (const auto& i : issues)
    if (i.severity == s) out += i.str() + "\n";
  return out;
}
std::string ConfigReport::errors() const { return lines_of(issues, ConfigIssue::Severity::Error); }
std::string ConfigReport::warnings() const { return lines_of(issues, ConfigIssue::Severity::Warning); }

bool equals_ignoring_case(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// ---- parsing ---------------------------------------------------------------------------------

Config parse_config(const json& j, ConfigReport& report, const ParseOptions& options) {
  Config config;
  if (!j.is_object()) {
    report.error("", "the config must be a JSON object { ... }, found " + config_detail::shown(j));
    return config;
  }
  // The switch itself is read first: it decides how the rest of the keys are treated.
  std::string policy = options.unknown_keys.value_or(j.value("unknown_keys", json("error")).is_string()
                                                         ? j.value("unknown_keys", std::string("error"))
                                                         : std::string("error"));
  config_detail::ParseVisitor visitor(j, "", report, policy != "warn");
  config.fields(visitor);
  visitor.finish();
  if (options.unknown_keys) config.unknown_keys = *options.unknown_keys;
  if (options.client_optimizer) {
    if (config.optimizer) {
      report.error("optimizer", "tessera.initialize was given optimizer=" + options.client_optimizer->type +
                                    " as well; give the optimizer in one place");
    } else {
      config.optimizer.emplace();
      config.optimizer->client = true;
      config.optimizer->type = options.client_optimizer->type;
      config.optimizer->params.kind = "client";
      config.optimizer->params.lr = options.client_optimizer->lr;
    }
  }
  return config;
}

Config parse_and_resolve_config(const json& j, int world_size, ConfigReport& report, ResolvedLayout* layout,
                                const ParseOptions& options) {
  Config config = parse_config(j, report, options);
  ResolvedLayout resolved = resolve_config(config, world_size, report);
  if (layout) *layout = resolved;
  return config;
}

json config_to_json(const Config& config) {
  return section_to_json(config);
}

// ---- JSON text -------------------------------------------------------------------------------

std::optional<json> parse_json_text(const std::string& text, const std::string& source, ConfigReport& report) {
  // Duplicate keys are errors (as in DeepSpeed); nlohmann would keep the last one silently.
  struct Frame {
    std::string path;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> stack;
  std::vector<std::string> duplicates;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: {
        std::string path = stack.empty() ? "" : config_detail::join_path(stack.back().path, stack.back().last_key);
        stack.push_back({path, {}, {}});
        break;
      }
      case json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (!stack.back().keys.insert(key).second) duplicates.push_back(config_detail::join_path(stack.back().path, key));
        stack.back().last_key = key;
        break;
      }
      case json::parse_event_t::object_end:
        stack.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    json j = json::parse(text, callback, /*allow_exceptions=*/true, /*ignore_comments=*/true);
    for (const auto& d : duplicates) report.error(d, "duplicate key in " + source + " (keep one)");
    if (!duplicates.empty()) return std::nullopt;
    return j;
  } catch (const json::parse_error& e) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') ++line, column = 1;
      else ++column;
    }
    report.error("", source + " is not valid JSON (line " + std::to_string(line) + ", column " +
                         std::to_string(column) + "): " + e.what());
    return std::nullopt;
  }
}

std::string read_text_file(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError("cannot read config file '" + path + "': " +
                      (errno ? std::strerror(errno) : "cannot be opened"));
  // A directory opens, but reading it fails. POSIX stat rather than std::filesystem, whose symbols
  // can resolve to a broken copy exported by libtorch.so (see tests/engine/launch/test_launcher.cpp's TempDir).
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw ConfigError("cannot read config file '" + path + "': " + std::strerror(EISDIR));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read config file '" + path + "': read error");
  return s.str();
}

ConfigSource config_source(const std::string& path_or_json) {
  size_t first = path_or_json.find_first_not_of(" \t\r\n");
  ConfigSource s;
  s.inline_json = first != std::string::npos && path_or_json[first] == '{';
  s.name = s.inline_json ? "the inline JSON text" : "'" + path_or_json + "'";
  s.heading = s.inline_json ? "(inline JSON text)" : s.name;
  return s;
}

Config load_config(const std::string& path_or_json, int world_size, ResolvedLayout* layout,
                   std::vector<std::string>* warnings, const ParseOptions& options) {
  const ConfigSource source = config_source(path_or_json);
  std::string text = source.inline_json ? path_or_json : read_text_file(path_or_json);
  ConfigReport report;
  Config config;
  if (auto j = parse_json_text(text, source.name, report))
    config = parse_and_resolve_config(*j, world_size, report, layout, options);
  if (warnings)
    for (const auto& i : report.issues)
      if (i.severity == ConfigIssue::Severity::Warning) warnings->push_back(i.path_and_message());
  if (!report.ok()) throw ConfigError("invalid config " + source.heading + ":\n" + report.errors());
  return config;
}

}  // namespace tessera
