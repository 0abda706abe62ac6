// `tessera`: the command line. Subcommands live one per file in this folder.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "csrc/process_exit.h"
#include "engine/cli/commands.h"

static int main_body(int argc, char** argv) {
  CLI::App app{"tessera: a training engine for large models (DeepSpeed-compatible configs)"};
  app.require_subcommand(1);
  int exit_code = 0;
  // `tessera launch ... -- PROGRAM ARGS` (and `tessera plan --trials K -- PROGRAM ARGS`): the program's arguments are handed over untouched, not
  // parsed (CLI11 would split an argument like '[1,2]' into a list).
  int cli_argc = argc;
  std::vector<std::string> program;
  if (argc > 1 && (std::string(argv[1]) == "launch" || std::string(argv[1]) == "plan"))
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--") {
        cli_argc = i;
        program.assign(argv + i + 1, argv + argc);
        break;
      }
  tessera::register_config_command(app, exit_code);
  tessera::register_launch_command(app, exit_code, program);
  tessera::register_plot_command(app, exit_code);
  tessera::register_estimate_command(app, exit_code);
  tessera::register_plan_command(app, exit_code, program);
  tessera::register_probe_link_command(app, exit_code);
  tessera::register_checkpoint_command(app, exit_code);
  tessera::register_report_command(app, exit_code);
  try {
    app.parse(cli_argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 1;
  }
  return exit_code;
}

// Exits without LibTorch's static destructors (csrc/process_exit.h): main_body's objects are gone by then.
int main(int argc, char** argv) { tessera::exit_skipping_static_destructors(main_body(argc, argv)); }
