// `tessera launch`: starts this node's ranks of a job and supervises them, like torchrun on one
// node. Each rank gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...); when one rank
// fails, the others are stopped (SIGTERM, then SIGKILL after the grace period) and the launcher
// returns the failing rank's status. See docs/launcher.md.
#pragma once

#include <string>
#include <vector>

#include "engine/launch/launch_config.h"

namespace tessera {

// Runs `command` (program and arguments, looked up in PATH) as config.nproc_per_node ranks and
// waits for them. Returns the launcher's exit status: 0 when every rank exits 0; else the first
// failing rank's status (its exit code, or 128 + signal when a signal killed it); 128 + signal when
// the launcher itself was interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT are forwarded to the ranks).
// Throws ConfigError, before starting anything, when the config is invalid or `command` is empty.
// Installs its own signal handlers while it runs (restored on return): one launch at a time.
int launch(const LaunchConfig& config, const std::vector<std::string>& command);

// The environment a rank starts with, as "NAME=value" strings: the launcher's own environment,
// then config.env, then the per-rank variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TESSERA_TIMEOUT_S, OMP_NUM_THREADS).
std::vector<std::string> rank_environment(const LaunchConfig& config, int local_rank);

}  // namespace tessera
