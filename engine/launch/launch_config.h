// The launch config: how `tessera launch` starts the ranks of a job on this node.
//
// Same scheme as the training config (engine/config/config.h): every default is a member initializer,
// and each struct lists its JSON keys once, in `fields(v)`, which drives parsing (with the JSON
// path in every error and "did you mean" for unknown keys) and printing.
//
// Multi-node: `hosts.method` says where the nodes come from. "local": the launcher starts this
// node's `nproc_per_node` ranks, and a job of `nnodes` nodes runs `tessera launch --nnodes N
// --node-rank K` once on every node (as with torchrun). "ssh" and "pdsh": one launcher, on any
// machine, reads `hosts.hostfile` and starts that node launcher on every host over ssh (or pdsh);
// "slurm": it runs the node launcher on every node of the allocation through `srun`
// (engine/launch/hosts_launch.h).
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
  std::string method = "local";  // "local", "ssh", "pdsh" or "slurm"
  std::string hostfile;          // "ssh"/"pdsh": DeepSpeed's format, one "HOST slots=N" per line
  std::string include;           // DeepSpeed's "host1:0,1@host2": only these hosts (and slots)
  std::string exclude;           // "host1:0@host3": every host and slot but these
  // NAME=VALUE lines set on every host. "": the first of ./.tessera_env, ./.deepspeed_env,
  // ~/.tessera_env, ~/.deepspeed_env that exists (DeepSpeed's .deepspeed_env, as it reads it).
  std::string env_file;
  // Variables of the launcher's own environment whose names start with one of these are set on
  // every host too (DeepSpeed forwards NCCL*, PYTHON*, MV2*, UCX*).
  std::vector<std::string> export_prefixes = {"NCCL", "PYTHON", "MV2", "UCX", "TESSERA", "GLOO",
                                              "TORCH", "OMP", "LD_LIBRARY_PATH"};
  std::vector<std::string> ssh_args;  // extra arguments for ssh, also pdsh's: ["-p", "2222", "-F", "file"]
  double connect_timeout_s = 10;      // reaching a host (ssh's ConnectTimeout) before anything starts
  std::string tessera_path;           // the tessera program on the hosts; "": this launcher's own path

  template <class V> void fields(V& v) {
    v("method", method, one_of({"local", "ssh", "pdsh", "slurm"}));
    v("hostfile", hostfile);
    v("include", include);
    v("exclude", exclude);
    v("env_file", env_file);
    v("export_prefixes", export_prefixes);
    v("ssh_args", ssh_args);
    v("connect_timeout_s", connect_timeout_s, greater_than(0.0));
    v("tessera_path", tessera_path);
  }
};

struct LaunchConfig {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  // "": 127.0.0.1 on one node; with hosts.method "ssh"/"pdsh" the first host, with "slurm" the
  // allocation's first node.
  std::string master_addr;
  int master_port = 29500;
  // Unset: OMP_NUM_THREADS=1 for every rank when nproc_per_node > 1 and the launcher's own
  // environment has no OMP_NUM_THREADS (torchrun's rule: N ranks each using every core would
  // oversubscribe the CPU).
  std::optional<int> omp_num_threads;
  bool tag_output = false;     // prefix each line a rank prints with "[rankN]: "
  bool pass_local_rank = false;  // append --local_rank=N to each rank's arguments (DeepSpeed's launcher does)
  double grace_period_s = 5;   // after a failure: SIGTERM, wait this long, then SIGKILL
  double timeout_s = 300;      // rendezvous/collective timeout, given to ranks as TESSERA_TIMEOUT_S
  // torchrun's --max-restarts: after a failure (or a hang, below) every rank is stopped and the
  // node's ranks start again, up to this many times (engine/launch/restarts.h).
  int max_restarts = 0;
  // torchrun's --nnodes MIN:MAX (hostfile launches): a restart continues on the hosts still
  // reachable, as long as there are at least this many. 0: all nnodes hosts, always.
  int min_nnodes = 0;
  // A rank whose training made no progress (no optimizer step: its heartbeat file untouched) for
  // this long after its first step is hung: the node's ranks are stopped as after a failure. 0: off.
  double hang_timeout_s = 0;
  std::map<std::string, std::string> env;  // extra environment variables for every rank
  // One entry per node: that node's ranks get CUDA_VISIBLE_DEVICES set to it (the slots --include
  // or --exclude chose on each host). Empty: CUDA_VISIBLE_DEVICES is left as it is.
  std::vector<std::string> node_devices;
  LaunchHostsConfig hosts;
  std::string unknown_keys = "error";  // "warn" downgrades unknown keys to warnings

  template <class V> void fields(V& v) {
    v("nproc_per_node", nproc_per_node, at_least(1));
    v("nnodes", nnodes, at_least(1));
    v("node_rank", node_rank, at_least(0));
    v("master_addr", master_addr);
    v("master_port", master_port, in_range(1, 65535));
    v("omp_num_threads", omp_num_threads, at_least(1));
    v("tag_output", tag_output);
    v("pass_local_rank", pass_local_rank);
    v("grace_period_s", grace_period_s, at_least(0.0));
    v("timeout_s", timeout_s, greater_than(0.0));
    v("max_restarts", max_restarts, at_least(0));
    v("min_nnodes", min_nnodes, at_least(0));
    v("hang_timeout_s", hang_timeout_s, at_least(0.0));
    v("env", env);
    v("node_devices", node_devices);
    v("hosts", hosts);
    v("unknown_keys", unknown_keys, one_of({"error", "warn"}));
  }

  int world_size() const { return nnodes * nproc_per_node; }
  std::string master_address() const { return master_addr.empty() ? "127.0.0.1" : master_addr; }
};

// JSON -> LaunchConfig, then the checks that span keys (node_rank < nnodes, `env` names, what each
// hosts.method needs), skipping those that involve a key that failed to parse. Every
// problem goes into `report` with its JSON path.
LaunchConfig parse_launch_config(const nlohmann::json& j, ConfigReport& report);

// `path_or_json` is a file path, JSON text if it starts with '{', or "" for all defaults.
// `overrides` (same keys, e.g. from command-line flags) are merged over the file before parsing,
// so they are checked the same way. Throws ConfigError listing every error (a key that fails to
// parse does not hide the others: only the checks involving it are skipped); warnings are returned
// through `warnings` when given, each "<path>: <message>" (the caller says "warning").
// `given`, when set, receives the merged JSON (which keys the file or the flags set).
LaunchConfig load_launch_config(const std::string& path_or_json,
                                const nlohmann::json& overrides = nlohmann::json::object(),
                                std::vector<std::string>* warnings = nullptr, nlohmann::json* given = nullptr);

// The effective launch config, every default filled in.
nlohmann::json launch_config_to_json(const LaunchConfig& config);

}  // namespace tessera
