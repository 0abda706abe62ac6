// `tessera`: the command line. Subcommands live one per file in this folder.
#include <cstdio>
#include <exception>

#include "engine/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: a training engine for large models (DeepSpeed-compatible configs)"};
  app.require_subcommand(1);
  int exit_code = 0;
  tessera::register_config_command(app, exit_code);
  tessera::register_launch_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
