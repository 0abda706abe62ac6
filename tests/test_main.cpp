// Catch2's runner for tessera_tests. ctest starts this binary once per test case, so it ends without
// LibTorch's static destructors (csrc/process_exit.h: about 0.25 s of CPU each time).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "csrc/process_exit.h"

int main(int argc, char** argv) {
  int status = 0;
  {
    Catch::Session session;
    status = session.run(argc, argv);
  }
  tessera::exit_skipping_static_destructors(status);
}
