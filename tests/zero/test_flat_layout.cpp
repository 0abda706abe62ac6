// The flat layout's arithmetic: reverse order, buckets, padding, each rank's chunks and pieces.
#include <catch2/catch.hpp>

#include "zero/flat_layout.h"

using namespace tessera;

TEST_CASE("parameters are laid out in reverse order in padded buckets") {
  // sizes 10, 7, 5, 30 with buckets of at most 16 elements on 4 ranks
  FlatLayout L = FlatLayout::build({10, 7, 5, 30}, 4, 16);
  REQUIRE(L.buckets.size() == 3);
  CHECK(L.buckets[0].params == std::vector<int>{3});     // the 30-element parameter alone (too big)
  CHECK(L.buckets[0].numel == 32);                        // padded to a multiple of 4
  CHECK(L.buckets[1].params == std::vector<int>{2, 1});   // 5 + 7 = 12 <= 16
  CHECK(L.buckets[1].numel == 12);
  CHECK(L.buckets[2].params == std::vector<int>{0});
  CHECK(L.buckets[2].numel == 12);
  CHECK(L.params[3].offset == 0);
  CHECK(L.params[2].offset == 32);
  CHECK(L.params[1].offset == 37);
  CHECK(L.params[0].offset == 44);
  CHECK(L.total == 56);
  CHECK(L.shard_numel == 14);  // 8 + 3 + 3
  CHECK(L.padding() == 4);
  CHECK(L.buckets[1].shard_offset == 8);
  CHECK(L.flat_of_local(2, 1) == 32 + 2 * 3);
}

TEST_CASE("the pieces of each rank cover every parameter exactly once") {
  FlatLayout L = FlatLayout::build({10, 7, 5, 30, 1}, 3, 20);
  std::vector<int64_t> covered(L.params.size(), 0);
  for (int r = 0; r < 3; ++r) {
    int64_t last_local = -1;
    for (const auto& p : L.pieces(r)) {
      covered[p.param] += p.numel;
      CHECK(p.local_offset > last_local);
      CHECK(p.local_offset + p.numel <= L.shard_numel);
      last_local = p.local_offset;
    }
  }
  for (size_t i = 0; i < L.params.size(); ++i) CHECK(covered[i] == L.params[i].numel);
}

TEST_CASE("one partition keeps every bucket whole") {
  FlatLayout L = FlatLayout::build({3, 4}, 1, 100);
  REQUIRE(L.buckets.size() == 1);
  CHECK(L.total == 7);
  CHECK(L.shard_numel == 7);
  CHECK(L.padding() == 0);
}
