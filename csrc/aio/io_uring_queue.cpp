// io_uring through liburing: one ring of `depth` entries, used by the I/O thread alone.
#include "csrc/aio/kernel_queue.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#if TESSERA_HAVE_LIBURING
#include <liburing.h>
#endif

namespace tessera::aio {

#if TESSERA_HAVE_LIBURING
namespace {

// The ring itself failed (not one transfer): the blocks in flight can no longer be accounted for,
// and waiting on them would hang every rank, so the process stops with the reason.
[[noreturn]] void fatal(const char* call, int error) {
  std::fprintf(stderr, "tessera: asynchronous I/O failed: %s: %s\n", call, std::strerror(-error));
  std::abort();
}

class IoUringQueue final : public KernelQueue {
 public:
  explicit IoUringQueue(io_uring ring) : ring_(ring) {}
  ~IoUringQueue() override { io_uring_queue_exit(&ring_); }

  void prepare(BlockIo* b) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) {  // ring full of unsubmitted entries: make room
      submit();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (b->write) io_uring_prep_write(sqe, b->fd, b->buffer, static_cast<unsigned>(b->bytes), b->offset);
    else io_uring_prep_read(sqe, b->fd, b->buffer, static_cast<unsigned>(b->bytes), b->offset);
    io_uring_sqe_set_data(sqe, b);
  }

  void submit() override {
    // Until the kernel has taken every prepared entry (a submit may take only some). The run loop
    // already counts them in flight, so one left behind would never complete.
    for (int tries = 0; io_uring_sq_ready(&ring_) > 0;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0 || r == -EINTR) continue;
      if ((r == -EAGAIN || r == -EBUSY) && ++tries < 1000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      fatal("io_uring_submit", r);
    }
  }

  void reap(std::vector<std::pair<BlockIo*, int64_t>>& completed) override {
    io_uring_cqe* cqe = nullptr;
    int r;
    do r = io_uring_wait_cqe(&ring_, &cqe);
    while (r == -EINTR);
    if (r < 0) fatal("io_uring_wait_cqe", r);
    while (r == 0 && cqe) {
      completed.emplace_back(static_cast<BlockIo*>(io_uring_cqe_get_data(cqe)), cqe->res);
      io_uring_cqe_seen(&ring_, cqe);
      cqe = nullptr;
      r = io_uring_peek_cqe(&ring_, &cqe);
    }
  }

 private:
  io_uring ring_;
};

}  // namespace

std::unique_ptr<KernelQueue> make_io_uring_queue(int depth, std::string& why) {
  io_uring ring;
  const int r = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0);
  if (r < 0) {
    why = std::string("io_uring_queue_init: ") + std::strerror(-r);
    return nullptr;
  }
  return std::make_unique<IoUringQueue>(ring);
}
#else
std::unique_ptr<KernelQueue> make_io_uring_queue(int, std::string& why) {
  why = "built without liburing";
  return nullptr;
}
#endif

}  // namespace tessera::aio
