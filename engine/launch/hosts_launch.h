// Starting one job on several hosts from one machine (hosts.method "ssh", "pdsh" or "slurm"):
// the hosts come from a hostfile (engine/launch/hostfile.h) or from the SLURM allocation, and on
// each one the single-node launcher (engine/launch/launcher.h) starts that node's ranks with its node
// rank, the master address and the forwarded environment. Every host is reached before any rank
// starts; the first host whose launcher fails stops the others (their connections close, and a node
// launcher whose connection goes away stops its ranks); output lines come back as "HOST: [rankN]: ".
// See docs/launcher.md, "Several hosts from one command".
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/launch/hostfile.h"
#include "engine/launch/launch_config.h"

namespace tessera {

// The node counts the user asked for (flags or keys of the config file); unset: from the hosts.
struct NodeCounts {
  std::optional<int> nnodes, nproc_per_node;
};

// Where a multi-host job runs: the hosts in node-rank order, and the config every node's launcher
// runs with (each gets its own node_rank). `environment` is the launcher's own ("NAME=value").
struct HostsPlan {
  std::vector<HostSlots> hosts;
  LaunchConfig node_config;
};
HostsPlan plan_hosts(const LaunchConfig& config, const NodeCounts& asked, const std::vector<std::string>& environment);

using EnvironmentList = std::vector<std::pair<std::string, std::string>>;

// What is set on every host: the variables of `environment` whose names start with one of
// hosts.export_prefixes, then those of the env file (hosts.env_file, else the first of
// ./.tessera_env, ./.deepspeed_env, ~/.tessera_env, ~/.deepspeed_env; `home` is ~). `env_file_used`
// receives the file read, or "". Throws ConfigError for an unreadable or malformed env file.
EnvironmentList forwarded_environment(const LaunchHostsConfig& hosts, const std::vector<std::string>& environment,
                                      const std::string& home, std::string* env_file_used = nullptr);

// The shell command line a host runs: cd to `cwd`, set `env`, exec `tessera_path launch` with the
// node's config and `node_rank` (inserted as is: "1", pdsh's "%n", srun's "$SLURM_NODEID"), which
// stops the node's ranks when its connection goes away (--exit-with-parent), then `command`.
std::string node_command_line(const LaunchConfig& node_config, const std::string& node_rank, const EnvironmentList& env,
                              const std::string& cwd, const std::string& tessera_path,
                              const std::vector<std::string>& command);

// 'text' quoted for a POSIX shell.
std::string shell_quote(const std::string& text);

// Runs `command` as every rank of the job on the hosts of config.hosts. Returns the job's exit
// status: 0, the first failing host's status (its launcher's: the failing rank's), or 128 + signal
// when interrupted. Throws ConfigError (bad hostfile, filters, env file) or std::runtime_error (a
// host that cannot be reached, naming it) before anything starts.
int launch_on_hosts(const LaunchConfig& config, const std::vector<std::string>& command, const NodeCounts& asked);

}  // namespace tessera
