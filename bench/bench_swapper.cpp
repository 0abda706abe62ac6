// NVMe optimizer offload at the disk's speed (docs/offload.md): the optimizer swapper's step
// (offload/optimizer_swapper.h) against the raw O_DIRECT bandwidth of the same directory, measured
// in the same run through the same I/O engine.
//
// The swapper holds one group of NUMEL shard elements (one segment, a bucket's shard) with Adam's two state arrays and, with
// mixed precision, the fp32 master (3 arrays a tile), cut into tiles of TILE elements through
// BUFFERS buffers with pipelined reads and writes, as the engine configures it (the swapper cuts
// a large segment into at least 8 tiles whatever TILE says: offload/swap_tiles.h). Each step calls a
// tile step that does no arithmetic, so what is timed is the step's own I/O: every slot read and
// written once. The baseline moves the same bytes in 64 MiB transfers, the whole file queued
// at once: a write pass then a read pass, and both at once (writes to one file while reading
// another); the faster of the two is what the disk can do for a step's bytes. Prints one JSON line
// per run and the ratio baseline time / step time (1.0: the disk's speed; issue 48 asks >= 0.8).
//
//   bench_swapper DIR [NUMEL=32e6] [TILE=4e6] [BUFFERS=4] [STEPS=3] [ARRAYS=3]
#include <ATen/ops/zeros.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/aio/async_io.h"
#include "offload/optimizer_swapper.h"

using namespace tessera;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Moves `total` bytes between one file and `buffer` in transfers of `slot` bytes, all queued at
// once (as the swapper queues its tiles); returns the seconds.
double raw_pass(AsyncIo& io, const AioFile& file, AlignedBuffer& buffer, int64_t total, int64_t slot, bool write) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t offset = 0; offset < total; offset += slot) {
    const int64_t n = std::min(slot, total - offset);
    if (write) io.write(file, buffer.data(), n, offset);
    else io.read(file, buffer.data(), n, offset);
  }
  io.wait_all();
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_swapper DIR [NUMEL] [TILE] [BUFFERS] [STEPS] [ARRAYS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t numel = argc > 2 ? static_cast<int64_t>(std::atof(argv[2])) : 32'000'000;
  const int64_t tile = argc > 3 ? static_cast<int64_t>(std::atof(argv[3])) : 4'000'000;
  const int buffers = argc > 4 ? std::atoi(argv[4]) : 4;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 3;
  const int arrays = argc > 6 ? std::atoi(argv[6]) : 3;  // Adam's m, v (+ the master with mixed precision)
  const bool master_in_file = arrays == 3;

  // The swapper, as the engine builds it for one bucket's shard segment.
  OptimizerSwapOptions o;
  o.path = dir;
  o.tile_numel = tile;
  o.buffer_count = buffers;
  o.pipeline_read = o.pipeline_write = true;
  OptimizerSwapper swapper(o);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor grads = at::zeros({numel}, f32), master = at::zeros({numel}, f32);
  at::Tensor params = master_in_file ? at::Tensor() : at::zeros({numel}, f32);
  at::Tensor compute = master_in_file ? at::zeros({numel}, f32.dtype(at::kBFloat16)) : at::Tensor();
  ShardSegment segment;
  segment.grads = grads;
  segment.params = params;
  segment.compute_copy = compute;
  const int64_t file_bytes =
      swapper.add_group(0, {segment}, master_in_file ? 2 : arrays, master_in_file ? master : at::Tensor());
  swapper.create_files();
  master = at::Tensor();
  const int64_t slot = 64 << 20;  // the raw passes' transfers (bench_aio's): the disk's best, whatever the tiles

  // The raw baseline in the same directory, the same backend and transfer size.
  std::unique_ptr<AsyncIo> io = AsyncIo::create(o.aio);
  AlignedBuffer buffer(slot);
  std::memset(buffer.data(), 1, static_cast<size_t>(buffer.capacity()));
  double raw_write = 1e30, raw_read = 1e30, raw_both = 1e30;
  {
    AioFile file = AioFile::create(dir + "/tessera-bench-swapper-raw.swp");
    AioFile other = AioFile::create(dir + "/tessera-bench-swapper-raw2.swp");
    AlignedBuffer second(slot);
    raw_pass(*io, other, second, file_bytes, slot, true);  // a file to read while writing the first
    for (int round = 0; round < 3; ++round) {  // the best of three rounds of each
      raw_write = std::min(raw_write, raw_pass(*io, file, buffer, file_bytes, slot, true));
      ::fdatasync(file.fd());
      raw_read = std::min(raw_read, raw_pass(*io, file, buffer, file_bytes, slot, false));
      const auto start = std::chrono::steady_clock::now();
      for (int64_t offset = 0; offset < file_bytes; offset += slot) {
        const int64_t n = std::min(slot, file_bytes - offset);
        io->write(file, buffer.data(), n, offset);
        io->read(other, second.data(), n, offset);
      }
      io->wait_all();
      ::fdatasync(file.fd());
      raw_both = std::min(raw_both, seconds_since(start));
    }
  }
  std::remove((dir + "/tessera-bench-swapper-raw.swp").c_str());
  std::remove((dir + "/tessera-bench-swapper-raw2.swp").c_str());
  const double raw_step = std::min(raw_write + raw_read, raw_both);
  std::printf("{\"what\": \"raw O_DIRECT\", \"backend\": \"%s\", \"bytes\": %lld, \"write_gbps\": %.3f, "
              "\"read_gbps\": %.3f, \"write_then_read_s\": %.3f, \"both_at_once_s\": %.3f}\n",
              aio_backend_name(swapper.backend()), (long long)file_bytes, file_bytes / raw_write / 1e9,
              file_bytes / raw_read / 1e9, raw_write + raw_read, raw_both);
  std::fflush(stdout);

  double best = 1e30;
  for (int step = 0; step <= steps; ++step) {  // step 0: the first, whose reads may find zeros only
    const int64_t read0 = swapper.bytes_read(), written0 = swapper.bytes_written();
    const auto start = std::chrono::steady_clock::now();
    swapper.step({{0, 0}}, [&](int, int) { return segment; },
                 [](int, const ShardSegment&, const std::vector<at::Tensor>&) {}, [](int, int) {});
    const double s = seconds_since(start);
    const int64_t read = swapper.bytes_read() - read0, written = swapper.bytes_written() - written0;
    if (step > 0) best = std::min(best, s);
    std::printf("{\"what\": \"swapper step\", \"step\": %d, \"read_bytes\": %lld, \"written_bytes\": %lld, "
                "\"seconds\": %.3f, \"gbps\": %.3f, \"of_raw\": %.3f}\n",
                step, (long long)read, (long long)written, s, (read + written) / s / 1e9, raw_step / s);
    std::fflush(stdout);
  }
  std::printf("{\"numel\": %lld, \"tile\": %lld, \"buffers\": %d, \"arrays\": %d, \"best_step_s\": %.3f, "
              "\"raw_step_s\": %.3f, \"of_raw\": %.3f}\n",
              (long long)numel, (long long)tile, buffers, arrays, best, raw_step, raw_step / best);
  return 0;
}
