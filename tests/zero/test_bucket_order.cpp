// The orders a step visits the engine's buckets in (zero/bucket_order.h), on groups built by hand:
// reductions group by group, or at ZeRO-3 by unit (last unit first, across groups, persistent
// buckets last); the buckets each unit reads (shared parameters included); the next forward's
// order (unit by unit, then the rest; without units each group's last bucket first).
#include <catch2/catch.hpp>

#include <ATen/ops/zeros.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/bucket_order.h"

using namespace tessera;

namespace {

// Three groups on 2 ranks, buckets of at most 8 elements:
//   group 0  persistent (ZeRO-3 keeps it whole): D (4)                 -> bucket 0
//   group 1  partitioned, keys = owning unit: A (10, unit 0), B (6, 1), C (8, 1)
//            placed by key, highest first, then in reverse registration: C | B | A
//   group 2  partitioned: E (4, unit 1), F (4, unit 0)                  -> E | F
// Unit 0 ("embedding") uses A, F and D; unit 1 ("block") uses B, C, E and A again (a tied weight).
struct Model {
  at::Tensor A = at::zeros({10}), B = at::zeros({6}), C = at::zeros({8}), D = at::zeros({4}), E = at::zeros({4}),
             F = at::zeros({4});
  Groups groups;
  ModelDescription description;
  std::unordered_map<const void*, std::string> names;

  Model() {
    add(false, {D}, {});
    add(true, {A, B, C}, {0, 1, 1});
    add(true, {E, F}, {1, 0});
    description.units = {{"embedding", {A, F, D}}, {"block", {B, C, E, A}}};
    const char* letters = "ABCDEF";
    int i = 0;
    for (const at::Tensor& t : {A, B, C, D, E, F}) names[t.unsafeGetTensorImpl()] = std::string(1, letters[i++]);
  }
  void add(bool partitioned, std::vector<at::Tensor> params, const std::vector<int>& keys) {
    auto g = std::make_unique<ZeroGroup>();
    std::vector<int64_t> numels;
    for (const at::Tensor& p : params) numels.push_back(p.numel());
    g->layout = FlatLayout::build(numels, 2, 8, keys);
    g->partitioned = partitioned;
    g->params = params;
    ParamGroup described;
    described.params = params;
    description.groups.push_back(std::move(described));
    groups.push_back(std::move(g));
  }
};

}  // namespace

TEST_CASE("bucket order: reductions go group by group - at ZeRO-3 by unit from the last - persistent buckets last") {
  Model m;
  REQUIRE(m.groups[1]->layout.buckets.size() == 3);
  CHECK(m.groups[1]->layout.buckets[0].params == std::vector<int>{2});  // C: the last unit, registered last
  CHECK(m.groups[1]->layout.buckets[2].params == std::vector<int>{0});  // A: unit 0
  CHECK(reduction_order(m.groups, false) == BucketOrder{{0, 0}, {1, 0}, {1, 1}, {1, 2}, {2, 0}, {2, 1}});
  // Backward finishes unit 1 (C, B, E) before unit 0 (A, F); D belongs to no unit's key.
  CHECK(reduction_order(m.groups, true) == BucketOrder{{1, 0}, {1, 1}, {2, 0}, {1, 2}, {2, 1}, {0, 0}});
}

TEST_CASE("bucket order: each unit reads its own buckets and the shared ones - the forward reads them unit by unit") {
  Model m;
  UnitTracker units(m.description, m.names);
  const std::vector<BucketOrder> by_unit = buckets_by_unit(m.groups, units);
  REQUIRE(by_unit.size() == 2);
  CHECK(by_unit[0] == BucketOrder{{0, 0}, {1, 2}, {2, 1}});          // D, A, F
  CHECK(by_unit[1] == BucketOrder{{1, 0}, {1, 1}, {1, 2}, {2, 0}});  // C, B, A (tied), E
  // A is read by both units, gathered for the first.
  CHECK(forward_order(m.groups, by_unit) == BucketOrder{{0, 0}, {1, 2}, {2, 1}, {1, 0}, {1, 1}, {2, 0}});
  // Without units: each group's last bucket first (the first parameters registered, read first).
  CHECK(forward_order(m.groups, {}) == BucketOrder{{0, 0}, {1, 2}, {1, 1}, {1, 0}, {2, 1}, {2, 0}});
}
