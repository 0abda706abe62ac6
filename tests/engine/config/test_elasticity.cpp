// DeepSpeed's elastic batch (engine/config/elasticity.h) on cases worked by hand; the comparison
// with DeepSpeed's own compute_elastic_config over many configs is
// tests/python/engine/test_elasticity.py.
#include "engine/config/elasticity.h"

#include <catch2/catch.hpp>

using namespace tessera;

namespace {
ElasticityConfig section(int64_t max_batch, std::vector<int64_t> micro, double version) {
  ElasticityConfig e;
  e.enabled = true;
  e.max_train_batch_size = max_batch;
  e.micro_batch_sizes = std::move(micro);
  e.version = version;
  return e;
}
}  // namespace

TEST_CASE("elasticity: the batch valid at the most sizes, its micro-batch and accumulation per size") {
  // Bases 2, 4, 6 and their lcm 12, each times the largest highly composite number within 2000:
  // 2 × 840 = 1680 and 4 × 360 = 6 × 240 = 12 × 120 = 1440. Up to 64 ranks 1680 divides over 22
  // sizes and 1440 over 21.
  ElasticityConfig e = section(2000, {2, 4, 6}, 0.1);
  e.max_gpus = 64;
  ElasticBatch at4 = compute_elastic_batch(e, 4);
  CHECK(at4.train_batch_size == 1680);
  CHECK(at4.valid_sizes.size() == 22);
  CHECK(at4.micro_batch == 6);
  CHECK(at4.gradient_accumulation_steps == 70);
  ElasticBatch at3 = compute_elastic_batch(e, 3);  // 560 per rank: 6 does not divide it, 4 does
  CHECK(at3.micro_batch == 4);
  CHECK(at3.gradient_accumulation_steps == 140);
  CHECK_THROWS_WITH(compute_elastic_batch(e, 9), Catch::Contains("the data-parallel size 9 is not one the elastic "
                                                                 "batch of 1680 splits into"));
  e.prefer_larger_batch = false;  // a tie would go to the smaller; here the counts decide
  CHECK(compute_elastic_batch(e, 4).train_batch_size == 1680);
}

TEST_CASE("elasticity: version 0.2 counts nodes, and a size outside them gets the batch that fits") {
  ElasticityConfig e = section(512, {8, 16}, 0.2);
  e.num_gpus_per_node = 4;
  e.min_gpus = 4;
  e.max_gpus = 64;
  // Per node of 4 data ranks: version 0.1 over max 128 and 1..16 nodes.
  ElasticBatch at8 = compute_elastic_batch(e, 8);
  CHECK(at8.train_batch_size % 8 == 0);
  CHECK(at8.train_batch_size == at8.micro_batch * at8.gradient_accumulation_steps * 8);
  // 3 ranks are not a whole number of nodes: each micro-batch size's largest multiple of
  // micro × 3 within 512 (8: 504, 16: 480), the larger kept; 8 divides its 168 per rank.
  ElasticBatch at3 = compute_elastic_batch(e, 3);
  CHECK(at3.train_batch_size == 504);
  CHECK(at3.valid_sizes == std::vector<int64_t>{3});
  CHECK(at3.micro_batch == 8);
  CHECK(at3.gradient_accumulation_steps == 21);
  e.num_gpus_per_node = 6;
  e.model_parallel_size = 4;
  CHECK_THROWS_WITH(compute_elastic_batch(e, 3), Catch::Contains("num_gpus_per_node 6 is not a multiple of "
                                                                 "model_parallel_size 4"));
}

TEST_CASE("elasticity: a section that cannot work names its key") {
  auto path_of = [](const ElasticityConfig& e) {
    try {
      compute_elastic_batch(e, 2);
    } catch (const ElasticityError& error) {
      return error.path;
    }
    return std::string("(no error)");
  };
  ElasticityConfig e = section(64, {2}, 0.2);
  e.max_train_batch_size.reset();
  CHECK(path_of(e) == "elasticity.max_train_batch_size");
  CHECK(path_of(section(64, {}, 0.2)) == "elasticity.micro_batch_sizes");
  CHECK(path_of(section(64, {0}, 0.2)) == "elasticity.micro_batch_sizes");
  CHECK(path_of(section(64, {128}, 0.1)) == "elasticity.micro_batch_sizes");  // above the largest batch
  CHECK(path_of(section(64, {2}, 0.3)) == "elasticity.version");
  e = section(64, {2}, 0.1);
  e.model_parallel_size = 2;
  CHECK(path_of(e) == "elasticity.model_parallel_size");
  e = section(64, {2}, 0.2);
  e.min_gpus = 8;
  e.max_gpus = 4;
  CHECK(path_of(e) == "elasticity.min_gpus");
}
