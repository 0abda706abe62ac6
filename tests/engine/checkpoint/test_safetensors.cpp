// engine/checkpoint/safetensors.h: every dtype round-trips bit for bit with its shape and the
// metadata; a damaged file (truncated, a header that lies, overlapping tensors, an unknown dtype)
// is refused naming the file and the tensor before anything is read. Interoperation with the
// `safetensors` package: tests/python/checkpoint/test_safetensors.py.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint/safetensors.h"
#include "tests/subprocess.h"

using tessera::checkpoint::SafetensorsError;
using tessera::checkpoint::SafetensorsReader;
using tessera::checkpoint::write_safetensors;
using tessera::testing::contains;
using tessera::testing::read_file;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file with one hand-written header and `data` after it.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file(path, bytes + header + data);
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const std::exception& e) {  // SafetensorsError for the contents, std::runtime_error from the system
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips with its shape and the metadata") {
  tessera::testing::TempDir dir;
  const at::Tensor f32 = at::randn({3, 5});
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", f32},
      {"f32.transposed", f32.t()},  // not contiguous: written in row-major order of its shape
      {"f64", at::randn({4}, at::kDouble)},
      {"f16", at::randn({2, 3}).to(at::kHalf)},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"i64", at::arange(-5, 6, at::kLong)},
      {"i32", at::arange(10, at::kInt)},
      {"i16", at::arange(3, at::kShort)},
      {"i8", at::arange(-3, 3, at::kChar)},
      {"u8", at::arange(200, 210, at::kByte)},
      {"bool", at::arange(6, at::kLong).remainder(2).to(at::kBool)},
      {"scalar", at::randn({})},
      {"empty", at::zeros({0, 4})},
  };
  write_safetensors(dir.file("a.safetensors"), tensors, {{"format", "pt"}, {"step", "12"}});
  SafetensorsReader reader(dir.file("a.safetensors"));
  CHECK(reader.tensors().size() == tensors.size());
  CHECK(reader.metadata().at("step") == "12");
  for (const auto& [name, t] : tensors) {
    INFO(name);
    at::Tensor back = reader.read(name);
    CHECK(back.sizes() == t.sizes());
    CHECK(back.scalar_type() == t.scalar_type());
    CHECK(at::equal(back, t.contiguous()));
  }
  // The data starts 8-byte aligned (the header is padded with spaces).
  const std::string bytes = read_file(dir.file("a.safetensors"));
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(header % 8 == 0);
  // read_into: the right shape and dtype, or an error naming both.
  at::Tensor into = at::zeros({3, 5});
  reader.read_into("f32", into);
  CHECK(at::equal(into, f32));
  at::Tensor wrong = at::zeros({5, 3});
  CHECK_THROWS_WITH(reader.read_into("f32", wrong), Catch::Contains("tensor \"f32\" is F32 [3, 5], not F32 [5, 3]"));
  CHECK_THROWS_WITH(reader.read("missing"), Catch::Contains("has no tensor \"missing\""));
  CHECK_THROWS_WITH(write_safetensors(dir.file("b.safetensors"), {{"x", f32}, {"x", f32}}),
                    Catch::Contains("the tensor name \"x\" is used twice"));
}

TEST_CASE("safetensors: a damaged file is refused naming the file and the tensor") {
  tessera::testing::TempDir dir;
  write_safetensors(dir.file("good.safetensors"), {{"w", at::randn({64})}, {"b", at::randn({8})}});
  const std::string good = read_file(dir.file("good.safetensors"));

  write_file(dir.file("cut.safetensors"), good.substr(0, good.size() - 10));
  const std::string cut = error_of(dir.file("cut.safetensors"));
  CHECK(contains(cut, "cut.safetensors"));
  CHECK(contains(cut, "outside the file's"));

  write_file(dir.file("short.safetensors"), good.substr(0, 5));
  CHECK(contains(error_of(dir.file("short.safetensors")), "too short for a safetensors file"));

  write_file(dir.file("header.safetensors"), good.substr(0, 40));
  CHECK(contains(error_of(dir.file("header.safetensors")), "its header claims"));

  write_raw(dir.file("json.safetensors"), "{not json", "");
  CHECK(contains(error_of(dir.file("json.safetensors")), "the header is not JSON"));

  write_raw(dir.file("dtype.safetensors"), R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})",
            std::string(2, '\0'));
  CHECK(contains(error_of(dir.file("dtype.safetensors")), "tensor \"w\": tessera: unsupported safetensors dtype \"F8_E4M3\""));

  write_raw(dir.file("size.safetensors"), R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  CHECK(contains(error_of(dir.file("size.safetensors")), "tensor \"w\": data_offsets hold 8 bytes, its shape and dtype need 12"));

  write_raw(dir.file("overlap.safetensors"),
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(12, '\0'));
  CHECK(contains(error_of(dir.file("overlap.safetensors")), "tensors \"a\" and \"b\" overlap"));

  CHECK(contains(error_of(dir.file("absent.safetensors")), "cannot open"));
}
