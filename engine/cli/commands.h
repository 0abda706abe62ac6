// The `tessera` command's subcommands; each registers itself on the app and sets `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera {

void register_config_command(CLI::App& app, int& exit_code);
void register_launch_command(CLI::App& app, int& exit_code);

}  // namespace tessera
