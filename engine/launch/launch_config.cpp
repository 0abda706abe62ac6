// Reading and checking the launch config (engine/launch/launch_config.h).
#include "engine/launch/launch_config.h"

#include <climits>
#include <initializer_list>
#include <string>

#include "engine/config/config_visitor.h"

namespace tessera {

using nlohmann::json;

// The variables the launcher sets for each rank (rank_environment in engine/launch/launcher.cpp).
// `env` may not set them: a second, silently losing value would be a trap.
static const char* const kLauncherVariables[] = {
    "RANK",      "WORLD_SIZE",      "LOCAL_RANK",  "LOCAL_WORLD_SIZE", "GROUP_RANK",        "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",      "TESSERA_TIMEOUT_S",
};

// Checks that span keys. A check that involves a key which failed to parse is skipped: that key's
// own error says what is wrong (`parsed` holds the parse errors).
static void check_launch_config(const LaunchConfig& c, const ConfigReport& parsed, ConfigReport& report) {
  auto unparsed = [&parsed](std::initializer_list<std::string> paths) {
    for (const auto& p : paths)
      if (has_error_at(parsed, p)) return true;
    return false;
  };
  if (c.node_rank >= c.nnodes && !unparsed({"node_rank", "nnodes"}))
    report.error("node_rank", "found " + std::to_string(c.node_rank) + ", expected a value < nnodes (" +
                                  std::to_string(c.nnodes) + "): node ranks count from 0");
  if (int64_t(c.nnodes) * c.nproc_per_node > INT_MAX && !unparsed({"nnodes", "nproc_per_node"}))
    report.error("nproc_per_node", "nnodes * nproc_per_node does not fit in an int");
  if (c.min_nnodes > 0 && !unparsed({"min_nnodes", "nnodes", "hosts.method"})) {
    if (c.min_nnodes > c.nnodes)
      report.error("min_nnodes", "found " + std::to_string(c.min_nnodes) + ", expected at most nnodes (" +
                                     std::to_string(c.nnodes) + ")");
    if (c.hosts.method != "ssh" && c.hosts.method != "pdsh" && c.min_nnodes != c.nnodes)
      report.error("min_nnodes", "an elastic node count (--nnodes MIN:MAX) needs a hostfile launch (hosts.method "
                                 "\"ssh\" or \"pdsh\"): its controller drops the hosts it cannot reach; found \"" +
                                     c.hosts.method + "\"");
  }
  if (!unparsed({"hosts.method"})) {
    const std::string& method = c.hosts.method;
    if ((method == "ssh" || method == "pdsh") && c.hosts.hostfile.empty() && !unparsed({"hosts.hostfile"}))
      report.error("hosts.hostfile", "found \"\", expected the path of a hostfile (\"HOST slots=N\" lines): hosts.method \"" +
                                         method + "\" starts the job on the hosts it lists");
    if ((method == "local" || method == "slurm") && !c.hosts.hostfile.empty() && !unparsed({"hosts.hostfile"}))
      report.warning("hosts.hostfile", "ignored: hosts.method is \"" + method + "\"");
    if (method != "ssh" && method != "pdsh")
      for (const char* key : {"include", "exclude"})
        if (!(key[0] == 'i' ? c.hosts.include : c.hosts.exclude).empty())
          report.warning(std::string("hosts.") + key, "ignored: hosts.method is \"" + method + "\" (it filters a hostfile)");
  }
  if (!c.hosts.include.empty() && !c.hosts.exclude.empty())
    report.error("hosts.exclude", "cannot be used with hosts.include (keep one of them)");
  if (!c.node_devices.empty() && int(c.node_devices.size()) != c.nnodes && !unparsed({"node_devices", "nnodes"}))
    report.error("node_devices", "found " + std::to_string(c.node_devices.size()) +
                                     " entries, expected one per node (nnodes = " + std::to_string(c.nnodes) + ")");
  for (const auto& [name, value] : c.env) {
    std::string path = "env." + name;
    if (name.empty() || name.find('=') != std::string::npos) {
      report.error(path, "not a valid environment variable name");
      continue;
    }
    for (const char* reserved : kLauncherVariables)
      if (name == reserved) report.error(path, "set by the launcher for each rank; use the launch config's own keys");
    if (name == "OMP_NUM_THREADS") report.error(path, "set \"omp_num_threads\" instead");
  }
}

LaunchConfig parse_launch_config(const json& j, ConfigReport& report) {
  if (!j.is_object()) {
    report.error("", "the launch config must be a JSON object { ... }, found " + config_detail::shown(j));
    return {};
  }
  // The switch itself is read first: it decides how the rest of the keys are treated.
  auto policy = j.find("unknown_keys");
  bool unknown_is_error = !(policy != j.end() && policy->is_string() && policy->get<std::string>() == "warn");
  ConfigReport own;
  LaunchConfig config = parse_section<LaunchConfig>(j, own, "", unknown_is_error);
  const ConfigReport parsed = own;
  check_launch_config(config, parsed, own);
  report.issues.insert(report.issues.end(), own.issues.begin(), own.issues.end());
  return config;
}

LaunchConfig load_launch_config(const std::string& path_or_json, const json& overrides,
                                std::vector<std::string>* warnings, json* given) {
  const ConfigSource source = config_source(path_or_json);
  ConfigReport report;
  LaunchConfig config;
  std::optional<json> j = json::object();
  if (!path_or_json.empty())
    j = parse_json_text(source.inline_json ? path_or_json : read_text_file(path_or_json), source.name, report);
  if (j) {
    // A non-object file is reported as such by the parser rather than replaced by the overrides.
    if (j->is_object()) j->merge_patch(overrides);
    config = parse_launch_config(*j, report);
    if (given) *given = *j;
  }
  if (warnings)
    for (const auto& i : report.issues)
      if (i.severity == ConfigIssue::Severity::Warning) warnings->push_back(i.path_and_message());
  if (!report.ok())
    throw ConfigError((path_or_json.empty() ? "invalid launch options" : "invalid launch config " + source.heading) +
                      ":\n" + report.errors());
  return config;
}

json launch_config_to_json(const LaunchConfig& config) { return section_to_json(config); }

}  // namespace tessera
