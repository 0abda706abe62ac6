// The launch config: how `tessera launch` starts the ranks of a job on this node.
//
// Same scheme as the training config (engine/config/config.h): every default is a member initializer,
// and each struct lists its JSON keys once, in `fields(v)`, which drives parsing (with the JSON
// path in every error and "did you mean" for unknown keys) and printing.
//
// Multi-node: `hosts` says where the nodes come from. Only "local" exists today: the launcher
// starts this node's `nproc_per_node` ranks, and a job of `nnodes` nodes runs
// `tessera launch --nnodes N --node-rank K` once on every node (as with torchrun). "ssh" (start
// every node's launcher from one machine, reading `hostfile`) and "slurm" (take nnodes/node_rank
// from SLURM_* variables) are reserved names so that adding them later keeps this shape.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config_io.h"
#include "engine/config/config_rules.h"

namespace tessera {

inline Rule<std::string> not_empty() {
  return {[](std::string& s) { return !s.empty(); }, "a non-empty string"};
}

struct LaunchHostsConfig {
  std::string method = "local";  // "local"; "ssh" and "slurm" are reserved, not implemented yet
  std::string hostfile;          // for "ssh": one "host slots=N" line per node

  template <class V> void fields(V& v) {
    v("method", method, one_of({"local", "ssh", "slurm"}));
    v("hostfile", hostfile);
  }
};

struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Unset: OMP_NUM_THREADS=1 for every rank when nproc_per_node > 1 and the launcher's own
  // environment has no OMP_NUM_THREADS (torchrun's rule: N ranks each using every core would
  // oversubscribe the CPU).
  std::optional<int> omp_num_threads;
  bool tag_output = false;     // prefix each line a rank prints with "[rankN]: "
  bool pass_local_rank = false;  // append --local_rank=N to each rank's arguments (DeepSpeed's launcher does)
  double grace_period_s = 5;   // after a failure: SIGTERM, wait this long, then SIGKILL
  double timeout_s = 300;      // rendezvous/collective timeout, given to ranks as TESSERA_TIMEOUT_S
  std::map<std::string, std::string> env;  // extra environment variables for every rank
  LaunchHostsConfig hosts;
  std::string unknown_keys = "error";  // "warn" downgrades unknown keys to warnings

  template <class V> void fields(V& v) {
    v("nproc_per_node", nproc_per_node, at_least(1));
    v("nnodes", nnodes, at_least(1));
    v("node_rank", node_rank, at_least(0));
    v("master_addr", master_addr, not_empty());
    v("master_port", master_port, in_range(1, 65535));
    v("omp_num_threads", omp_num_threads, at_least(1));
    v("tag_output", tag_output);
    v("pass_local_rank", pass_local_rank);
    v("grace_period_s", grace_period_s, at_least(0.0));
    v("timeout_s", timeout_s, greater_than(0.0));
    v("env", env);
    v("hosts", hosts);
    v("unknown_keys", unknown_keys, one_of({"error", "warn"}));
  }

  int world_size() const { return nnodes * nproc_per_node; }
};

// JSON -> LaunchConfig, then the checks that span keys (node_rank < nnodes, `env` names, hosts
// methods not implemented yet), skipping those that involve a key that failed to parse. Every
// problem goes into `report` with its JSON path.
LaunchConfig parse_launch_config(const nlohmann::json& j, ConfigReport& report);

// `path_or_json` is a file path, JSON text if it starts with '{', or "" for all defaults.
// `overrides` (same keys, e.g. from command-line flags) are merged over the file before parsing,
// so they are checked the same way. Throws ConfigError listing every error (a key that fails to
// parse does not hide the others: only the checks involving it are skipped); warnings are returned
// through `warnings` when given, each "<path>: <message>" (the caller says "warning").
LaunchConfig load_launch_config(const std::string& path_or_json,
                                const nlohmann::json& overrides = nlohmann::json::object(),
                                std::vector<std::string>* warnings = nullptr);

// The effective launch config, every default filled in.
nlohmann::json launch_config_to_json(const LaunchConfig& config);

}  // namespace tessera
