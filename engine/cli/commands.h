// The subcommands of the `tessera` executable; engine/cli/main.cpp registers them all. Each
// command sets `exit_code` (the process's exit status) when it runs.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tessera {

// `tessera config ...` (engine/cli/config_check.cpp).
void register_config_command(CLI::App& app, int& exit_code);

// `tessera launch [OPTIONS] -- PROGRAM [ARGS...]` (engine/cli/launch_command.cpp).
// `program`: everything after the first `--`, split off by main() so that it reaches the ranks verbatim.
void register_launch_command(CLI::App& app, int& exit_code, const std::vector<std::string>& program);

// `tessera plot METRICS.jsonl [-o PNG]` (engine/cli/plot_command.cpp): runs python/tessera/plot.py.
void register_plot_command(CLI::App& app, int& exit_code);

// `tessera estimate [OPTIONS]`: memory per GPU/CPU/NVMe, the verdict, the cheapest layouts (engine/cli/estimate_command.cpp).
void register_estimate_command(CLI::App& app, int& exit_code);

// `tessera plan [OPTIONS] [-- PROGRAM ARGS]`: every layout that fits, ranked by predicted step time;
// with --trials K the top K run as `program` under the launcher (engine/cli/plan_command.cpp).
void register_plan_command(CLI::App& app, int& exit_code, const std::vector<std::string>& program);

// `tessera probe-link`: Gloo's collectives timed across hosts for the planner's rate between nodes
// (engine/cli/probe_link_command.cpp; run under tessera launch).
void register_probe_link_command(CLI::App& app, int& exit_code);

// `tessera checkpoint export|inspect|import-deepspeed` (engine/cli/checkpoint_command.cpp).
void register_checkpoint_command(CLI::App& app, int& exit_code);

// `tessera report`: versions, CPU features, compiled-in parts and whether they work here
// (engine/cli/report_command.cpp; DeepSpeed's ds_report).
void register_report_command(CLI::App& app, int& exit_code);

// The commands written in Python (engine/cli/python_exec.cpp): $TESSERA_PYTHON, else the interpreter
// the build was configured with; exec_python replaces this process with `python args...`, or
// returns 127 with a message naming the command and what the interpreter `needs`.
std::string python_interpreter();
int exec_python(const std::string& command, std::vector<std::string> args, const std::string& needs);

}  // namespace tessera
