// The kernel's native asynchronous I/O (io_submit/io_getevents) through libaio.
#include "csrc/aio/kernel_queue.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if TESSERA_HAVE_LIBAIO
#include <libaio.h>
#endif

namespace tessera::aio {

#if TESSERA_HAVE_LIBAIO
namespace {

class LibaioQueue final : public KernelQueue {
 public:
  LibaioQueue(io_context_t context, int depth) : context_(context), control_(depth), events_(depth) {
    for (iocb& c : control_) free_.push_back(&c);
  }
  ~LibaioQueue() override { io_destroy(context_); }

  void prepare(BlockIo* b) override {
    iocb* c = free_.back();
    free_.pop_back();
    if (b->write) io_prep_pwrite(c, b->fd, b->buffer, static_cast<size_t>(b->bytes), b->offset);
    else io_prep_pread(c, b->fd, b->buffer, static_cast<size_t>(b->bytes), b->offset);
    c->data = b;
    prepared_.push_back(c);
  }

  void submit() override {
    size_t done = 0;
    while (done < prepared_.size()) {
      const int r = io_submit(context_, static_cast<long>(prepared_.size() - done), prepared_.data() + done);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) {  // the kernel refused the rest: complete them with its error
        for (size_t i = done; i < prepared_.size(); ++i) refused_.emplace_back(prepared_[i], r);
        break;
      }
      done += static_cast<size_t>(r);
    }
    prepared_.clear();
  }

  void reap(std::vector<std::pair<BlockIo*, int64_t>>& completed) override {
    for (auto& [c, error] : refused_) {
      completed.emplace_back(static_cast<BlockIo*>(c->data), error);
      free_.push_back(c);
    }
    if (!refused_.empty()) {
      refused_.clear();
      return;
    }
    int n;
    do n = io_getevents(context_, 1, static_cast<long>(events_.size()), events_.data(), nullptr);
    while (n == -EINTR);
    if (n < 0) {  // the context itself failed: blocks in flight can no longer be accounted for
      std::fprintf(stderr, "tessera: asynchronous I/O failed: io_getevents: %s\n", std::strerror(-n));
      std::abort();
    }
    for (int i = 0; i < n; ++i) {
      iocb* c = events_[i].obj;
      // res holds the bytes transferred, or −errno in the same (unsigned long) field.
      completed.emplace_back(static_cast<BlockIo*>(c->data), static_cast<int64_t>(static_cast<long>(events_[i].res)));
      free_.push_back(c);
    }
  }

 private:
  io_context_t context_;
  std::vector<iocb> control_;
  std::vector<io_event> events_;
  std::vector<iocb*> free_, prepared_;
  std::vector<std::pair<iocb*, int64_t>> refused_;
};

}  // namespace

std::unique_ptr<KernelQueue> make_libaio_queue(int depth, std::string& why) {
  io_context_t context{};
  const int r = io_setup(depth, &context);
  if (r < 0) {
    why = std::string("io_setup: ") + std::strerror(-r);
    return nullptr;
  }
  return std::make_unique<LibaioQueue>(context, depth);
}
#else
std::unique_ptr<KernelQueue> make_libaio_queue(int, std::string& why) {
  why = "built without libaio";
  return nullptr;
}
#endif

}  // namespace tessera::aio
