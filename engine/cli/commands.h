// The subcommands of the `tessera` executable; engine/cli/main.cpp registers them all. Each
// command sets `exit_code` (the process's exit status) when it runs.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera {

// `tessera config ...` (engine/cli/config_check.cpp).
void register_config_command(CLI::App& app, int& exit_code);

// `tessera launch [OPTIONS] -- PROGRAM [ARGS...]` (engine/cli/launch_command.cpp).
void register_launch_command(CLI::App& app, int& exit_code);

}  // namespace tessera
