// Catch2's runner for tessera_tests. ctest starts this binary once per test case (once per file for
// the files whose cases all run in this process), so it ends without LibTorch's static destructors
// (csrc/process_exit.h: about 0.25 s of CPU each time).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "csrc/process_exit.h"

int main(int argc, char** argv) {
  // Each file's name is a tag of its cases ("[#test_cpu_adam]", Catch's -#), always: ctest runs the
  // in-process files one process per file by that tag (tests/CMakeLists.txt), and the discovery
  // that lists the other cases must see the tags to leave those out.
  std::vector<char*> args(argv, argv + argc);
  char filenames_as_tags[] = "-#";
  if (std::none_of(args.begin(), args.end(), [](const char* a) { return std::string(a) == "-#"; }))
    args.insert(args.begin() + 1, filenames_as_tags);
  int status = 0;
  {
    Catch::Session session;
    status = session.run(static_cast<int>(args.size()), args.data());
  }
  tessera::exit_skipping_static_destructors(status);
}
