#include <catch2/catch.hpp>

#include "parallel/communicator.h"
#include "parallel/topology.h"

using namespace tessera;

TEST_CASE("grid shape divides the world into pipe x data x tensor") {
  std::string error;
  auto g = make_grid_shape(16, 2, 4, &error);
  REQUIRE(g);
  CHECK(g->pipe == 4);
  CHECK(g->data == 2);
  CHECK(g->tensor == 2);
  CHECK_FALSE(make_grid_shape(6, 4, 1, &error));
  CHECK(error.find("world size 6 is not divisible by tensor_parallel.tp_size (4) x pipeline.stages (1) = 4") !=
        std::string::npos);
  CHECK_FALSE(make_grid_shape(4, 0, 1, &error));
}

TEST_CASE("tensor varies fastest then data then pipe") {
  GridShape g{2, 2, 2};  // pipe, data, tensor
  CHECK(g.coordinates_of(0) == Coordinates{0, 0, 0});
  CHECK(g.coordinates_of(1) == Coordinates{0, 0, 1});
  CHECK(g.coordinates_of(2) == Coordinates{0, 1, 0});
  CHECK(g.coordinates_of(5) == Coordinates{1, 0, 1});
  for (int r = 0; r < 8; ++r) CHECK(g.rank_of(g.coordinates_of(r)) == r);
  CHECK(g.group_of(Axis::Tensor, 5) == std::vector<int>{4, 5});
  CHECK(g.group_of(Axis::Data, 5) == std::vector<int>{5, 7});
  CHECK(g.group_of(Axis::Pipe, 5) == std::vector<int>{1, 5});
  CHECK(g.group_of(Axis::Model, 5) == std::vector<int>{0, 1, 4, 5});
  CHECK(g.group_of(Axis::Model, 2) == std::vector<int>{2, 3, 6, 7});
}

TEST_CASE("the context axis sits between data and tensor: pipe x data x context x tensor") {
  std::string error;
  auto g = make_grid_shape(16, 2, 2, &error, 2);  // tensor 2, pipe 2, context 2: data 2
  REQUIRE(g);
  CHECK(g->data == 2);
  CHECK(g->context == 2);
  CHECK(g->world_size() == 16);
  CHECK(g->str() == "pipe 2 x data 2 x context 2 x tensor 2");
  CHECK(g->coordinates_of(3) == Coordinates{0, 0, 1, 1});  // pipe, data, tensor, context
  CHECK(g->coordinates_of(4) == Coordinates{0, 1, 0, 0});
  for (int r = 0; r < 16; ++r) CHECK(g->rank_of(g->coordinates_of(r)) == r);
  CHECK(g->group_of(Axis::Context, 5) == std::vector<int>{5, 7});
  CHECK(g->group_of(Axis::Data, 5) == std::vector<int>{1, 5});
  CHECK(g->group_of(Axis::Replicas, 5) == std::vector<int>{1, 3, 5, 7});
  CHECK(g->group_of(Axis::Tensor, 5) == std::vector<int>{4, 5});
  CHECK(g->group_of(Axis::Pipe, 5) == std::vector<int>{5, 13});
  CHECK(g->group_of(Axis::Model, 5) == std::vector<int>{4, 5, 12, 13});
  NamedAxes axes(*g);
  CHECK(axes.group_of("data*context", 5) == g->group_of(Axis::Replicas, 5));
  CHECK(axes.group_of("context", 5) == g->group_of(Axis::Context, 5));
  CHECK_FALSE(make_grid_shape(12, 2, 1, &error, 4));
  CHECK(error.find("x context_parallel.size (4) = 8") != std::string::npos);
  CHECK_FALSE(make_grid_shape(4, 1, 1, &error, 0));
  CHECK(error.find("context_parallel.size must be at least 1") != std::string::npos);
}

TEST_CASE("every axis's groups partition the world") {
  GridShape g{3, 2, 4, 2};
  for (Axis axis : {Axis::Pipe, Axis::Data, Axis::Context, Axis::Tensor, Axis::Model, Axis::Replicas}) {
    std::vector<int> count(g.world_size(), 0);
    for (const auto& group : g.all_groups(axis))
      for (int r : group) ++count[r];
    for (int c : count) CHECK(c == 1);
  }
  CHECK(g.all_groups(Axis::Tensor).size() == 12);
  CHECK(g.all_groups(Axis::Data).size() == 24);
  CHECK(g.all_groups(Axis::Context).size() == 24);
  CHECK(g.all_groups(Axis::Pipe).size() == 16);
  CHECK(g.all_groups(Axis::Model).size() == 4);
  CHECK(g.all_groups(Axis::Replicas).size() == 12);
}

TEST_CASE("balanced chunks cover the range with sizes differing by at most one") {
  for (int64_t n : {0, 1, 7, 8, 1001}) {
    for (int p : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int r = 0; r < p; ++r) {
        ChunkRange c = chunk_range(n, p, r);
        CHECK(c.begin == next);
        CHECK((c.size() == n / p || c.size() == n / p + 1));
        next = c.end;
      }
      CHECK(next == n);
    }
  }
  CHECK(chunk_range(7, 2, 0).size() == 4);
  CHECK(chunk_range(7, 2, 1).begin == 4);
}
