// NamedAxes (parallel/topology.h): the grid's axes by name, splits of an axis into factors, and the
// groups a product of axes names, as plain arithmetic on ranks.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "parallel/topology.h"

using tessera::GridShape;
using tessera::NamedAxes;
using Ranks = std::vector<int>;

TEST_CASE("NamedAxes: the grid's own axes name the same groups as GridShape") {
  const GridShape grid{2, 3, 2};  // pipe 2 x data 3 x tensor 2
  const NamedAxes axes(grid);
  for (int r = 0; r < grid.world_size(); ++r) {
    CHECK(axes.group_of("data", r) == grid.group_of(tessera::Axis::Data, r));
    CHECK(axes.group_of("tensor", r) == grid.group_of(tessera::Axis::Tensor, r));
    CHECK(axes.group_of("pipe", r) == grid.group_of(tessera::Axis::Pipe, r));
    CHECK(axes.group_of("pipe*tensor", r) == grid.group_of(tessera::Axis::Model, r));
  }
  CHECK(axes.group_of("pipe*data*tensor", 5).size() == 12);
}

TEST_CASE("NamedAxes: the data axis split into expert_data x expert, the expert factor fastest") {
  NamedAxes axes(GridShape{1, 4, 2});  // data 4 x tensor 2: data ranks are 0,2,4,6 and 1,3,5,7
  axes.split("data", {{"expert_data", 2}, {"expert", 2}});
  CHECK(axes.group_of("expert", 0) == Ranks{0, 2});
  CHECK(axes.group_of("expert", 4) == Ranks{4, 6});
  CHECK(axes.group_of("expert_data", 0) == Ranks{0, 4});
  CHECK(axes.group_of("expert_data", 3) == Ranks{3, 7});
  CHECK(axes.group_of("expert_data*expert", 5) == axes.group_of("data", 5));
  CHECK(axes.group_of("expert*tensor", 6) == Ranks{4, 5, 6, 7});
  CHECK(axes.spans("expert_data", "data"));
  CHECK_FALSE(axes.spans("expert_data", "tensor"));
  CHECK(axes.spans("expert*tensor", "tensor"));
  axes.split("data", {{"expert_data", 2}, {"expert", 2}});  // the same split again: nothing changes
  CHECK_THROWS_WITH(axes.split("data", {{"expert", 4}}), Catch::Contains("exists already"));
  CHECK_THROWS_WITH(axes.split("data", {{"a", 3}, {"b", 2}}), Catch::Contains("does not split"));
  CHECK_THROWS_WITH(axes.group_of("data*expert", 0), Catch::Contains("overlap"));
  CHECK_THROWS_WITH(axes.group_of("sequence", 0), Catch::Contains("no parallel axis named 'sequence'") &&
                                                    Catch::Contains("expert_data"));
}
