// The asynchronous I/O engine (csrc/aio/async_io.h) on each of its backends: transfers of unaligned
// sizes many in flight, waits out of order, and failures (a read past the end of a file, a write
// the kernel refuses) reported with the file and offset.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "csrc/aio/async_io.h"

using tessera::AioBackend;
using tessera::AioFile;
using tessera::AioOptions;
using tessera::AlignedBuffer;
using tessera::AsyncIo;

namespace {

std::string scratch_path(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera_aio_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

AlignedBuffer random_buffer(int64_t bytes, unsigned seed) {
  AlignedBuffer b(bytes);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(b.data());
  for (int64_t i = 0; i < b.capacity(); ++i) p[i] = static_cast<unsigned char>(rng());
  return b;
}

std::vector<AioBackend> all_backends() { return {AioBackend::kIoUring, AioBackend::kLibaio, AioBackend::kThreads}; }

}  // namespace

TEST_CASE("async io: unaligned sizes many in flight round-trip on every backend") {
  for (AioBackend backend : all_backends()) {
    AioOptions o;
    o.backend = backend;
    o.block_size = 64 << 10;
    o.queue_depth = 4;
    o.intra_op_parallelism = 3;
    std::unique_ptr<AsyncIo> io = AsyncIo::create(o);
    REQUIRE(io->backend() == backend);
    AioFile file = AioFile::create(scratch_path(std::string("roundtrip_") + tessera::aio_backend_name(backend)));
    const std::vector<int64_t> sizes = {1, 4095, 4097, (3 << 20) + 17, 10 << 20};
    std::vector<AlignedBuffer> out, in;
    std::vector<int64_t> offsets;
    int64_t offset = 0;
    std::vector<AsyncIo::Ticket> tickets;
    for (size_t i = 0; i < sizes.size(); ++i) {
      out.push_back(random_buffer(sizes[i], 17 + unsigned(i)));
      offsets.push_back(offset);
      tickets.push_back(io->write(file, out.back().data(), sizes[i], offset));
      offset += tessera::aio_aligned(sizes[i]);
    }
    for (size_t i = tickets.size(); i-- > 0;) io->wait(tickets[i]);  // out of order
    int64_t aligned_total = 0;
    for (int64_t s : sizes) aligned_total += tessera::aio_aligned(s);
    CHECK(io->bytes_written() == aligned_total);
    for (size_t i = 0; i < sizes.size(); ++i) {
      in.emplace_back(sizes[i]);
      std::memset(in.back().data(), 0, static_cast<size_t>(in.back().capacity()));
      io->read(file, in.back().data(), sizes[i], offsets[i]);
    }
    io->wait_all();
    CHECK(io->bytes_read() == aligned_total);
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO(tessera::aio_backend_name(backend) << " transfer " << i << " of " << sizes[i] << " bytes");
      CHECK(std::memcmp(in[i].data(), out[i].data(), static_cast<size_t>(sizes[i])) == 0);
    }
  }
}

TEST_CASE("async io: a read past the end of the file fails naming the file and offset") {
  for (AioBackend backend : all_backends()) {
    AioOptions o;
    o.backend = backend;
    std::unique_ptr<AsyncIo> io = AsyncIo::create(o);
    const std::string path = scratch_path(std::string("short_") + tessera::aio_backend_name(backend));
    AioFile file = AioFile::create(path);
    AlignedBuffer b = random_buffer(8192, 3);
    io->write(file, b.data(), 8192, 0);
    io->wait_all();
    const AsyncIo::Ticket t = io->read(file, b.data(), 8192, 4096);
    try {
      io->wait(t);
      FAIL("no error for a read past the end with " << tessera::aio_backend_name(backend));
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(path) != std::string::npos);
      CHECK(what.find("offset 4096") != std::string::npos);
    }
    // The engine is still usable after a failure.
    io->read(file, b.data(), 8192, 0);
    io->wait_all();
  }
}

TEST_CASE("async io: a write the kernel refuses (file size limit) fails - every backend") {
  // In a child process: the file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the kernel refuse
  // the block past 1 MiB with EFBIG, as a full disk refuses with ENOSPC.
  for (AioBackend backend : all_backends()) {
    const std::string path = scratch_path(std::string("limit_") + tessera::aio_backend_name(backend));
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      signal(SIGXFSZ, SIG_IGN);
      rlimit limit{1 << 20, 1 << 20};
      setrlimit(RLIMIT_FSIZE, &limit);
      int code = 1;
      try {
        AioOptions o;
        o.backend = backend;
        o.block_size = 256 << 10;
        std::unique_ptr<AsyncIo> io = AsyncIo::create(o);
        AioFile file = AioFile::create(path);
        AlignedBuffer b = random_buffer(4 << 20, 5);
        io->write(file, b.data(), 4 << 20, 0);
        io->wait_all();
        code = 2;  // no error
      } catch (const std::runtime_error& e) {
        code = std::string(e.what()).find(path) != std::string::npos ? 0 : 3;
      }
      _exit(code);
    }
    int status = 0;
    waitpid(child, &status, 0);
    INFO(tessera::aio_backend_name(backend) << ": child exit " << WEXITSTATUS(status) << " (2: no error, 3: error without the path)");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("async io: bad input is refused clearly") {
  CHECK_THROWS_WITH(AioFile::create("/nonexistent-dir/x"), Catch::Contains("/nonexistent-dir/x"));
  AioOptions o;
  o.block_size = 1000;
  CHECK_THROWS_WITH(AsyncIo::create(o), Catch::Contains("aio.block_size"));
  std::unique_ptr<AsyncIo> io = AsyncIo::create();
  AioFile file = AioFile::create(scratch_path("bad_offset"));
  AlignedBuffer b(4096);
  CHECK_THROWS_WITH(io->write(file, b.data(), 4096, 100), Catch::Contains("multiples of 4096"));
  CHECK(tessera::parse_aio_backend("libaio") == AioBackend::kLibaio);
  CHECK_FALSE(tessera::parse_aio_backend("posix"));
}
