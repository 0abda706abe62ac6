// The hosts of a multi-host job: DeepSpeed's hostfile ("worker-1 slots=4" per line), narrowed by
// --include / --exclude ("worker-1:0,1@worker-2") or by --num_nodes / --num_gpus, as DeepSpeed's
// runner does. Used by engine/launch/hosts_launch.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessera {

struct HostSlots {
  std::string host;        // as the hostfile writes it: a name ssh resolves, or an address
  std::vector<int> slots;  // the slots (GPUs) of it the job uses, ascending
};

// Each line: `HOST slots=N` (N >= 1); `#` starts a comment; blank lines are skipped. Throws
// ConfigError naming `source`:LINE for a malformed line, a repeated host, or no host at all.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source);
std::vector<HostSlots> read_hostfile(const std::string& path);

// DeepSpeed's filters. `include` keeps only the hosts (and, with `:i,j`, the slots) it names;
// `exclude` drops them (a host left without slots goes); `num_nodes` keeps the first N hosts and
// `num_gpus` the first N slots of each. include with exclude, or either with num_nodes/num_gpus, is
// an error, as is naming a host or slot the hostfile lacks (ConfigError, naming it).
std::vector<HostSlots> select_hosts(const std::vector<HostSlots>& hosts, const std::string& include,
                                    const std::string& exclude, std::optional<int> num_nodes,
                                    std::optional<int> num_gpus);

}  // namespace tessera
