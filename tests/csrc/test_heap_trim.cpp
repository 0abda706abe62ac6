// The heap trimmer (csrc/heap_trim.h): its policy on a scripted resident set (trim after the first
// step, then only past the warm-up steps' largest by the bound), and a real trim by glibc.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <vector>

#include "csrc/heap_trim.h"

using tessera::HeapTrimmer;
using tessera::resident_set_bytes;

TEST_CASE("heap trimmer: trims after the first step - then only once the resident set outgrows the warm-up steps' by the bound") {
  int64_t rss = 900;
  int trims = 0;
  HeapTrimmer trimmer(100, 3, [&] { return rss; }, [&] { ++trims, rss -= 150; });
  CHECK(trimmer.after_step());  // the first step: what construction freed goes back
  CHECK(trims == 1);
  rss = 900;
  CHECK_FALSE(trimmer.after_step());  // three warm-up steps: the largest, 1000, is the reference
  rss = 1000;
  CHECK_FALSE(trimmer.after_step());
  rss = 980;
  CHECK_FALSE(trimmer.after_step());
  rss = 1100;
  CHECK_FALSE(trimmer.after_step());  // within the bound
  rss = 1101;
  CHECK(trimmer.after_step());  // past it: trimmed back to 951, the reference stays 1000
  CHECK(trims == 2);
  rss = 1090;
  CHECK_FALSE(trimmer.after_step());
  // A working set that really grew: after the trim it is still 1250, which becomes the reference.
  rss = 1400;
  CHECK(trimmer.after_step());
  rss = 1300;
  CHECK_FALSE(trimmer.after_step());
  CHECK(trimmer.trims() == 3);

  // Had the first measured step been the reference (900), 1001 would have trimmed.
  HeapTrimmer warm(100, 2, [&] { return rss; }, [&] { ++trims; });
  warm.after_step();  // the first step's trim
  rss = 900;
  warm.after_step();
  rss = 1000;
  warm.after_step();
  rss = 1090;
  CHECK_FALSE(warm.after_step());

  trims = 0;
  HeapTrimmer never(-1, 0, [&] { return rss * 10; }, [&] { ++trims; });
  CHECK_FALSE(never.after_step());
  CHECK_FALSE(never.after_step());
  HeapTrimmer always(0, 5, [&] { return rss; }, [&] { ++trims; });
  CHECK(always.after_step());  // no warm-up when trimming every step
  CHECK(always.after_step());
  CHECK(trims == 2);
}

TEST_CASE("heap trimmer: glibc hands freed heap pages back") {
  // Fragment the heap: 200 blocks of 256 KiB (in the heap once the mmap threshold is raised by a
  // freed 4 MiB mmap), free all but the last so the heap top cannot shrink, then trim.
  void* big = std::malloc(4 << 20);
  std::memset(big, 1, 4 << 20);
  std::free(big);
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) {
    blocks.push_back(std::malloc(256 << 10));
    std::memset(blocks.back(), 1, 256 << 10);
  }
  for (int i = 0; i + 1 < 200; ++i) std::free(blocks[i]);
  const int64_t before = resident_set_bytes();
  REQUIRE(before > 0);
  HeapTrimmer trimmer(0);
  CHECK(trimmer.after_step());
  const int64_t after = resident_set_bytes();
  std::free(blocks.back());
  INFO("resident before " << before / 1024 << " KiB, after " << after / 1024 << " KiB");
  CHECK(after < before - (20 << 20));  // most of the ~50 MiB freed went back
}
