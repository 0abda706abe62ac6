// Asynchronous file I/O for NVMe offload: reads and writes between aligned buffers and files opened
// with O_DIRECT, many in flight, on one of three backends behind this one interface:
//   io_uring  (liburing)     submission and completion rings shared with the kernel
//   libaio    (io_submit)    the kernel's older asynchronous I/O
//   threads   (pread/pwrite) a pool of `intra_op_parallelism` threads, for kernels without either
// The backend is the first of these that works here, or the one TESSERA_AIO_BACKEND (io_uring,
// libaio, threads) or AioOptions::backend names, so tests run all three on one machine.
//
// A transfer is cut into blocks of `block_size` bytes; at most `queue_depth` blocks are in flight
// (the thread backend: one per thread).
// One I/O thread per engine keeps the queue full and reaps completions, so the caller computes while
// the disk works, and waits only for the transfer it needs next (the tile pipeline of
// offload/optimizer_swapper.h). DeepSpeed's `aio` keys mean the same here (docs/offload.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace tessera {

enum class AioBackend { kIoUring, kLibaio, kThreads };
const char* aio_backend_name(AioBackend backend);
// "io_uring" / "libaio" / "threads"; std::nullopt for anything else.
std::optional<AioBackend> parse_aio_backend(const std::string& name);

struct AioOptions {
  int64_t block_size = 1 << 20;   // aio.block_size: bytes per block (a multiple of 4096)
  int queue_depth = 8;            // aio.queue_depth: blocks in flight
  int intra_op_parallelism = 1;   // aio.intra_op_parallelism: threads of the thread backend
  bool single_submit = false;     // aio.single_submit: one system call per block instead of per batch
  std::optional<AioBackend> backend;  // else TESSERA_AIO_BACKEND, else the first that works
};

// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block; 4096 covers
// every device in use.
constexpr int64_t kAioAlignment = 4096;
inline int64_t aio_aligned(int64_t bytes) { return (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment; }

// Host memory for direct transfers: aligned to kAioAlignment, capacity rounded up to it.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  void* data() const { return data_; }
  int64_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  int64_t capacity_ = 0;
};

// A swap file open for direct I/O, locked (flock) while open; closed and removed on destruction.
class AioFile {
 public:
  // Creates `path` with O_DIRECT, or takes over and truncates a file left by a killed run (never
  // reading it); throws naming the path and the reason, also when a live process holds it.
  static AioFile create(const std::string& path);
  AioFile(AioFile&& other) noexcept;
  AioFile& operator=(AioFile&& other) noexcept;
  AioFile(const AioFile&) = delete;
  ~AioFile();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool replaced_stale() const { return replaced_stale_; }  // a file of that name was there

 private:
  AioFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
  bool replaced_stale_ = false;
};

class AsyncIo {
 public:
  using Ticket = int64_t;

  static std::unique_ptr<AsyncIo> create(const AioOptions& options = {});
  virtual ~AsyncIo() = default;

  // Queue a transfer of `bytes` at `offset` (a multiple of kAioAlignment); `bytes` is rounded up
  // to kAioAlignment, so `buffer` must hold that many (an AlignedBuffer does). Returns at once.
  virtual Ticket read(const AioFile& file, void* buffer, int64_t bytes, int64_t offset) = 0;
  virtual Ticket write(const AioFile& file, const void* buffer, int64_t bytes, int64_t offset) = 0;
  // Wait for one transfer, or for all queued ones. A failed or short transfer throws
  // std::runtime_error naming the file, the offset and the system's reason.
  virtual void wait(Ticket ticket) = 0;
  virtual void wait_all() = 0;

  virtual AioBackend backend() const = 0;
  virtual int64_t bytes_read() const = 0;
  virtual int64_t bytes_written() const = 0;
};

}  // namespace tessera
