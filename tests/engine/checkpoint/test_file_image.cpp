// engine/checkpoint/file_image.h and file_io.h's direct writes: an asynchronous save's snapshot laid
// out as its file is a safetensors file whose data starts at 4 KiB, holding exactly the bytes (and
// checksums) write_safetensors writes; written with O_DIRECT where the file system has it (the
// file's pages then are not in the page cache), with ordinary writes on tmpfs and from an unaligned
// buffer. The `safetensors` package reads such a file: tests/python/checkpoint/test_safetensors.py.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint/file_image.h"
#include "engine/checkpoint/file_io.h"
#include "engine/checkpoint/rank_file.h"
#include "engine/checkpoint/safetensors.h"
#include "tests/subprocess.h"

using namespace tessera::checkpoint;
using tessera::aio_aligned;
using tessera::kAioAlignment;
using tessera::testing::read_file;

namespace {

NamedTensors mixed_tensors() {
  const at::Tensor f32 = at::randn({300, 7});
  return {
      {"f32", f32},
      {"f32.transposed", f32.t()},                    // not contiguous
      {"bf16.odd", at::randn({5}).to(at::kBFloat16)},  // 10 bytes: what follows starts unaligned
      {"i64", at::arange(-5, 6, at::kLong)},
      {"u8", at::arange(200, 213, at::kByte)},
      {"bool", at::arange(6, at::kLong).remainder(2).to(at::kBool)},
      {"scalar", at::randn({})},
      {"empty", at::zeros({0, 4})},
      {"f64", at::randn({1000}, at::kDouble)},
  };
}

int64_t data_start(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return 8 + static_cast<int64_t>(n);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// How many of the file's pages are in the page cache.
int64_t cached_pages(const std::string& path) {
  const int64_t size = file_size(path);
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  const int64_t page = ::sysconf(_SC_PAGESIZE), pages = (size + page - 1) / page;
  std::vector<unsigned char> resident(static_cast<size_t>(pages));
  REQUIRE(::mincore(p, static_cast<size_t>(size), resident.data()) == 0);
  ::munmap(p, static_cast<size_t>(size));
  int64_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

void check_reads_back(const std::string& path, const NamedTensors& tensors) {
  SafetensorsReader reader(path);
  CHECK(reader.tensors().size() == tensors.size());
  CHECK(reader.metadata().at("rank") == "3");
  for (const auto& [name, t] : tensors) {
    INFO(name);
    const at::Tensor back = reader.read(name);
    CHECK(back.sizes() == t.sizes());
    CHECK(back.scalar_type() == t.scalar_type());
    CHECK(at::equal(back, t.contiguous()));
  }
}

}  // namespace

TEST_CASE("file image: the file write_safetensors writes, its data at 4 KiB, written directly") {
  tessera::testing::TempDir dir;
  const NamedTensors tensors = mixed_tensors();
  const std::string plain = dir.file("plain.safetensors"), direct = dir.file("direct.safetensors");
  write_safetensors(plain, tensors, rank_file_metadata(3));
  const FileImage image = make_file_image(tensors, rank_file_metadata(3), direct);
  CHECK(reinterpret_cast<uintptr_t>(image.data()) % kAioAlignment == 0);
  CHECK(image.buffer.numel() == aio_aligned(image.size));
  const bool was_direct = write_file_image(image, direct);
  CHECK(file_size(direct) == image.size);
  check_reads_back(direct, tensors);
  // The same data bytes as write_safetensors' file, after a header padded to 4096.
  const std::string a = read_file(plain), b = read_file(direct);
  CHECK(data_start(b) % kAioAlignment == 0);
  CHECK(data_start(b) >= kAioAlignment);
  CHECK(a.substr(static_cast<size_t>(data_start(a))) == b.substr(static_cast<size_t>(data_start(b))));
  CHECK(image.tensors.front().begin == data_start(b));
  // A file system with direct I/O (the test directory's, usually ext4 or xfs) keeps none of it
  // cached; one without (tmpfs) got ordinary writes. Whichever it was, say so.
  WARN("the test directory " << (was_direct ? "took O_DIRECT" : "has no O_DIRECT: ordinary writes"));
  if (was_direct) {
    const std::string big = dir.file("big.safetensors");
    const NamedTensors large = {{"x", at::randn({4 << 20})}};  // 16 MiB
    REQUIRE(write_file_image(make_file_image(large, rank_file_metadata(3), big), big));
    CHECK(cached_pages(big) == 0);
  }
}

TEST_CASE("file image: ordinary writes on tmpfs and from an unaligned buffer, the same file") {
  const NamedTensors tensors = mixed_tensors();
  const FileImage image = make_file_image(tensors, rank_file_metadata(3), "x");
  if (::access("/dev/shm", W_OK) == 0) {
    const std::string path = "/dev/shm/tessera-file-image-" + std::to_string(::getpid()) + ".safetensors";
    const bool was_direct = write_file_image(image, path);
    CHECK(file_size(path) == image.size);
    check_reads_back(path, tensors);
    ::unlink(path.c_str());
    WARN("/dev/shm " << (was_direct ? "took O_DIRECT" : "refused O_DIRECT: ordinary writes"));
  }
  tessera::testing::TempDir dir;
  // One byte off the alignment: the bytes move to another buffer, written without O_DIRECT.
  std::vector<char> shifted(static_cast<size_t>(image.size) + 1);
  std::memcpy(shifted.data() + 1, image.data(), static_cast<size_t>(image.size));
  CHECK_FALSE(write_file_direct(dir.file("shifted.safetensors"), shifted.data() + 1, image.size));
  check_reads_back(dir.file("shifted.safetensors"), tensors);
  CHECK(read_file(dir.file("shifted.safetensors")) == std::string(image.data(), static_cast<size_t>(image.size)));
}

TEST_CASE("file image: a snapshot's rank file records the checksums of the file written from the tensors") {
  tessera::testing::TempDir dir;
  RankFile from_tensors;
  from_tensors.tensors = mixed_tensors();
  for (auto& [name, t] : from_tensors.tensors) t = t.contiguous();
  RankFile snapshot = from_tensors;
  snapshot.snapshot(3, dir.file("b"));
  CHECK(snapshot.tensors.empty());
  CHECK(snapshot.bytes() == snapshot.image->buffer.numel());
  const auto a = write_rank_file(from_tensors, dir.file("a"), "a", 3);
  const auto b = write_rank_file(snapshot, dir.file("b"), "b", 3);
  CHECK(a.at("xxh64") == b.at("xxh64"));
  CHECK(b.at("bytes").get<int64_t>() == snapshot.image->size);
  check_reads_back(dir.file("b"), from_tensors.tensors);
}
