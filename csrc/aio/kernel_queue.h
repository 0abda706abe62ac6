// The kernel's asynchronous I/O queues behind one small interface, for csrc/aio/async_io.cpp's I/O
// thread: prepare blocks, submit them, reap completions. io_uring (liburing) and libaio each fit in
// one file; a build without the library gets nullptr from its factory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tessera::aio {

struct BlockIo {
  int fd = -1;
  char* buffer = nullptr;
  int64_t bytes = 0;
  int64_t offset = 0;
  bool write = false;
  int64_t ticket = 0;
};

class KernelQueue {
 public:
  virtual ~KernelQueue() = default;
  // Queues one block (not yet visible to the kernel); at most `depth` are prepared or in flight.
  virtual void prepare(BlockIo* block) = 0;
  // Hands every prepared block to the kernel.
  virtual void submit() = 0;
  // Blocks until at least one block completes; appends (block, result) for each completed one, the
  // result being the bytes transferred or −errno.
  virtual void reap(std::vector<std::pair<BlockIo*, int64_t>>& completed) = 0;
};

// nullptr with `why` set when this kernel or build cannot give one.
std::unique_ptr<KernelQueue> make_io_uring_queue(int depth, std::string& why);
std::unique_ptr<KernelQueue> make_libaio_queue(int depth, std::string& why);

}  // namespace tessera::aio
