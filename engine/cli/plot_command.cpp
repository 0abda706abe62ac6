// `tessera plot METRICS.jsonl|CSV_DIR [-o loss.png] [--title T]`: draws loss, learning rate and
// throughput against the step from a metrics file written by the Python engine (csv_monitor), or
// against the sample count from a directory of csv_monitor's CSV files (DeepSpeed's layout), with matplotlib.
//
// The drawing is python/tessera/plot.py, run by python_exec.cpp's interpreter (the venv of
// scripts/setup.sh has matplotlib); the script needs neither torch nor the extension.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "engine/cli/commands.h"

#ifndef TESSERA_PLOT_SCRIPT
#define TESSERA_PLOT_SCRIPT "python/tessera/plot.py"
#endif

namespace tessera {

namespace {

struct PlotFlags {
  std::string metrics;
  std::string output;
  std::string title;
};

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int run_plot(const PlotFlags& flags) {
  if (!is_file(flags.metrics) && !is_dir(flags.metrics)) {
    std::cerr << "tessera plot: " << flags.metrics << ": no such file or directory (the config's csv_monitor writes "
              << "{output_path}/{job_name}/metrics.jsonl and DeepSpeed's CSV files beside it)\n";
    return 1;
  }
  const char* env_script = std::getenv("TESSERA_PLOT_SCRIPT");
  const std::string script = env_script && *env_script ? env_script : TESSERA_PLOT_SCRIPT;
  // "-m tessera.plot": the module of an installed package (pip install), run by its interpreter.
  const bool module = script.rfind("-m ", 0) == 0;
  if (!module && !is_file(script)) {
    std::cerr << "tessera plot: the plotting script " << script
              << " is missing (set TESSERA_PLOT_SCRIPT to python/tessera/plot.py of a tessera checkout)\n";
    return 1;
  }
  std::vector<std::string> args = module ? std::vector<std::string>{"-m", script.substr(3), flags.metrics}
                                         : std::vector<std::string>{script, flags.metrics};
  if (!flags.output.empty()) {
    args.push_back("-o");
    args.push_back(flags.output);
  }
  if (!flags.title.empty()) {
    args.push_back("--title");
    args.push_back(flags.title);
  }
  return exec_python("plot", args, "matplotlib");
}

}  // namespace

void register_plot_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PlotFlags>();
  CLI::App* sub = app.add_subcommand(
      "plot", "Draw loss, learning rate and throughput against the step from a metrics file (PNG, matplotlib)");
  sub->add_option("metrics", flags->metrics,
                  "The metrics file (JSON Lines), {output_path}/{job_name}/metrics.jsonl, or the directory of csv_monitor's CSV files")
      ->required();
  sub->add_option("-o,--output", flags->output, "The PNG to write (default: loss.png next to the metrics file)");
  sub->add_option("--title", flags->title, "The figure's title");
  sub->callback([flags, &exit_code] { exit_code = run_plot(*flags); });
}

}  // namespace tessera
