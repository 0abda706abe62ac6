// The pieces of a checkpoint that need no ranks: the checksum against xxHash's published values,
// the metadata's checks (engine/checkpoint/metadata.h), and sizes as the export command reads them.
#include <catch2/catch.hpp>

#include <string>

#include "engine/checkpoint/checksum.h"
#include "engine/checkpoint/export.h"
#include "engine/checkpoint/metadata.h"

using namespace tessera::checkpoint;

TEST_CASE("xxh64 matches the reference implementation", "[checkpoint]") {
  CHECK(xxh64_hex("", 0) == "ef46db3751d8e999");
  CHECK(xxh64_hex("a", 1) == "d24ec4f1a98c6e5b");
  CHECK(xxh64_hex("abc", 3) == "44bc2cf5ad770999");
  // 773 bytes: the 32-byte stripes, then 8-, 4- and 1-byte tails (python's xxhash package).
  std::string bytes;
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  bytes += "xyz12";
  CHECK(xxh64_hex(bytes.data(), bytes.size()) == "9b7d50c047818b1b");
}

namespace {
std::string metadata_with(const std::string& shards) {
  return R"({"format": "tessera-checkpoint", "version": 1, "tag": "t",
    "layout": {"world_size": 2, "data_parallel": 2, "tensor_parallel": 1, "pipeline_parallel": 1, "zero_stage": 1,
               "optimizer": "Adam", "compute_dtype": "fp32", "states": ["fp32", "exp_avg", "exp_avg_sq"]},
    "engine": {"global_step": 3, "skipped_steps": 0, "optimizer_step_base": 0, "schedule_step_base": 0,
               "loss_scaler": {"type": "none", "scale": 1.0}}, "client_state": {},
    "parameters": [{"name": "w", "shape": [2, 5], "dtype": "F32", "pipeline_stage": 0, "tensor_rank": -1,
                    "shards": )" + shards + R"(}],
    "groups": [],
    "files": {"rank00000.safetensors": {"rank": 0, "bytes": 10, "xxh64": {}},
              "rank00001.safetensors": {"rank": 1, "bytes": 10, "xxh64": {}}}})";
}
}  // namespace

TEST_CASE("checkpoint metadata is checked field by field", "[checkpoint]") {
  const Metadata m = Metadata::parse(metadata_with(R"([{"file": "rank00001.safetensors", "begin": 6, "end": 10},
                                                       {"file": "rank00000.safetensors", "begin": 0, "end": 6}])"),
                                     "m.json");
  REQUIRE(m.parameters.size() == 1);
  CHECK(m.parameters[0].shards[0].begin == 0);  // sorted by range
  CHECK(m.layout.str() == "data 2 x tensor 1 x pipe 1, ZeRO 1, Adam, fp32");
  CHECK(m.find("w", 0, -1) != nullptr);
  CHECK(m.find("w", 0, 0) == nullptr);
  // Round trip.
  CHECK(Metadata::parse(m.to_json().dump(), "again.json").to_json() == m.to_json());

  CHECK_THROWS_WITH(Metadata::parse(metadata_with(R"([{"file": "rank00000.safetensors", "begin": 0, "end": 6}])"), "m.json"),
                    Catch::Contains("m.json") && Catch::Contains("end at element 6 of 10"));
  CHECK_THROWS_WITH(Metadata::parse(metadata_with(R"([{"file": "rank00000.safetensors", "begin": 0, "end": 6},
                                                      {"file": "rank00001.safetensors", "begin": 5, "end": 10}])"), "m.json"),
                    Catch::Contains("do not cover"));
  CHECK_THROWS_WITH(Metadata::parse(metadata_with(R"([{"file": "rank00009.safetensors", "begin": 0, "end": 10}])"), "m.json"),
                    Catch::Contains(".parameters[0].shards[0].file") && Catch::Contains("not in .files"));
  CHECK_THROWS_WITH(Metadata::parse(R"({"format": "tessera-checkpoint", "version": 2})", "m.json"),
                    Catch::Contains(".version") && Catch::Contains("reads version 1"));
  CHECK_THROWS_WITH(Metadata::parse("{not json", "m.json"), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(Metadata::parse(R"({"format": "tessera-checkpoint", "version": 1, "tag": 5})", "m.json"),
                    Catch::Contains(".tag") && Catch::Contains("expected a string"));
  std::string no_counter = metadata_with(R"([{"file": "rank00000.safetensors", "begin": 0, "end": 10}])");
  no_counter.replace(no_counter.find("\"skipped_steps\": 0, "), 20, "");
  CHECK_THROWS_WITH(Metadata::parse(no_counter, "m.json"), Catch::Contains(".engine.skipped_steps") && Catch::Contains("missing"));
}

TEST_CASE("export sizes read like the command line writes them", "[checkpoint]") {
  CHECK(parse_size("5GB") == 5'000'000'000);
  CHECK(parse_size("500MB") == 500'000'000);
  CHECK(parse_size("2GiB") == 2LL << 30);
  CHECK(parse_size("1.5kb") == 1500);
  CHECK(parse_size("4096") == 4096);
  CHECK_THROWS_WITH(parse_size("5 parsecs"), Catch::Contains("expected a positive number"));
  CHECK_THROWS(parse_size("-1GB"));
  CHECK_THROWS(parse_size("GB"));
}
