// Raw sequential O_DIRECT bandwidth of a directory's disk through tessera's I/O engine
// (csrc/aio/async_io.h): writes then reads one file in 1 MiB blocks with each backend at several
// queue depths, and the same with one thread doing blocking pwrite/pread (the baseline: what a
// plain loop gets). Prints one JSON line per (backend, queue depth) and a last line with the best
// of each direction and its ratio to the baseline. The NVMe offload benchmark compares the bytes
// an optimizer step swaps against this bandwidth (docs/offload.md).
//
//   bench_aio DIR [MiB=1024]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/aio/async_io.h"

using namespace tessera;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Moves `total` bytes between one file and `buffer` (transfers of `chunk` bytes, all queued at
// once, as the swapper queues a tile's slot); returns GB/s.
double run(AsyncIo& io, const AioFile& file, AlignedBuffer& buffer, int64_t total, bool write) {
  const int64_t chunk = buffer.capacity();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t offset = 0; offset < total; offset += chunk) {
    if (write) io.write(file, buffer.data(), chunk, offset);
    else io.read(file, buffer.data(), chunk, offset);
  }
  io.wait_all();
  return double(total) / seconds_since(start) / 1e9;
}

double baseline(const std::string& path, AlignedBuffer& buffer, int64_t total, bool write) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) std::exit(1);
  const int64_t block = 1 << 20;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t offset = 0; offset < total; offset += block) {
    char* p = static_cast<char*>(buffer.data()) + (offset % buffer.capacity());
    const ssize_t r = write ? ::pwrite(fd, p, block, offset) : ::pread(fd, p, block, offset);
    if (r != block) std::exit(1);
  }
  if (write) ::fdatasync(fd);
  ::close(fd);
  return double(total) / seconds_since(start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_aio DIR [MiB]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t total = (argc > 2 ? std::atoll(argv[2]) : 1024) << 20;
  AlignedBuffer buffer(64 << 20);  // a tile's slot: many blocks queued at once
  std::memset(buffer.data(), 1, static_cast<size_t>(buffer.capacity()));
  const std::string base_path = dir + "/tessera-bench-baseline.swp";
  const double base_write = baseline(base_path, buffer, total, true), base_read = baseline(base_path, buffer, total, false);
  ::unlink(base_path.c_str());
  std::printf("{\"backend\": \"pwrite/pread, 1 thread\", \"queue_depth\": 1, \"write_gbps\": %.3f, \"read_gbps\": %.3f}\n",
              base_write, base_read);
  double best_write = 0, best_read = 0;
  std::string best_write_at, best_read_at;
  for (AioBackend backend : {AioBackend::kIoUring, AioBackend::kLibaio, AioBackend::kThreads}) {
    for (int depth : {1, 4, 8, 16, 32}) {
      AioOptions o;
      o.backend = backend;
      o.queue_depth = depth;
      o.intra_op_parallelism = backend == AioBackend::kThreads ? depth : 1;
      std::unique_ptr<AsyncIo> io;
      try {
        io = AsyncIo::create(o);
      } catch (const std::exception& e) {
        std::printf("{\"backend\": \"%s\", \"unavailable\": \"%s\"}\n", aio_backend_name(backend), e.what());
        break;
      }
      AioFile file = AioFile::create(dir + "/tessera-bench-aio.swp");
      const double w = run(*io, file, buffer, total, true);
      ::fdatasync(file.fd());
      const double r = run(*io, file, buffer, total, false);
      std::printf("{\"backend\": \"%s\", \"queue_depth\": %d, \"write_gbps\": %.3f, \"read_gbps\": %.3f}\n",
                  aio_backend_name(backend), depth, w, r);
      std::fflush(stdout);
      const std::string at = std::string(aio_backend_name(backend)) + " qd " + std::to_string(depth);
      if (w > best_write) best_write = w, best_write_at = at;
      if (r > best_read) best_read = r, best_read_at = at;
    }
  }
  std::printf("{\"best_write_gbps\": %.3f, \"at\": \"%s\", \"vs_pwrite\": %.2f, \"best_read_gbps\": %.3f, \"at_read\": "
              "\"%s\", \"vs_pread\": %.2f, \"bytes\": %lld}\n",
              best_write, best_write_at.c_str(), best_write / base_write, best_read, best_read_at.c_str(),
              best_read / base_read, (long long)total);
  return 0;
}
