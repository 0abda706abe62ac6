// The commands that are Python programs (`tessera plot`, `tessera checkpoint import-deepspeed`) run
// by the interpreter the build was configured with (-DPython_EXECUTABLE: the venv of
// scripts/setup.sh, where `pip install -e .` put tessera) or by $TESSERA_PYTHON. The command
// replaces itself with it (exec), so the exit status and the output are the program's.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "engine/cli/commands.h"

#ifndef TESSERA_PYTHON_DEFAULT
#define TESSERA_PYTHON_DEFAULT "python3"
#endif

namespace tessera {

std::string python_interpreter() {
  const char* env = std::getenv("TESSERA_PYTHON");
  return env && *env ? env : TESSERA_PYTHON_DEFAULT;
}

int exec_python(const std::string& command, std::vector<std::string> args, const std::string& needs) {
  const std::string python = python_interpreter();
  args.insert(args.begin(), python);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  ::execvp(argv[0], argv.data());
  const int err = errno;
  std::cerr << "tessera " << command << ": could not run " << python << ": " << std::strerror(err)
            << " (set TESSERA_PYTHON to a Python with " << needs << ")\n";
  return 127;
}

}  // namespace tessera
