#include "csrc/aio/async_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "csrc/aio/kernel_queue.h"

namespace tessera {

using aio::BlockIo;

const char* aio_backend_name(AioBackend backend) {
  switch (backend) {
    case AioBackend::kIoUring: return "io_uring";
    case AioBackend::kLibaio: return "libaio";
    case AioBackend::kThreads: return "threads";
  }
  return "?";
}

std::optional<AioBackend> parse_aio_backend(const std::string& name) {
  for (AioBackend b : {AioBackend::kIoUring, AioBackend::kLibaio, AioBackend::kThreads})
    if (name == aio_backend_name(b)) return b;
  return std::nullopt;
}

// ---- buffers and files -----------------------------------------------------------------------------

AlignedBuffer::AlignedBuffer(int64_t bytes) : capacity_(aio_aligned(std::max<int64_t>(bytes, 1))) {
  data_ = std::aligned_alloc(kAioAlignment, static_cast<size_t>(capacity_));
  if (!data_) throw std::bad_alloc();
}
AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), capacity_(o.capacity_) {
  o.data_ = nullptr;
  o.capacity_ = 0;
}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(capacity_, o.capacity_);
  return *this;
}
AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AioFile AioFile::create(const std::string& path) {
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    throw std::runtime_error("tessera: cannot create " + path + " for direct I/O: " + std::strerror(e) +
                             (e == EINVAL ? " (the filesystem does not support O_DIRECT)" : ""));
  }
  // One owner at a time: a live process's file is never truncated under it; a killed run's is.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw std::runtime_error("tessera: " + path + " is in use by another process (locked); give each job its own "
                             "directory");
  }
  if (::ftruncate(fd, 0) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error("tessera: cannot truncate " + path + ": " + std::strerror(e));
  }
  AioFile file(fd, path);
  file.replaced_stale_ = existed;
  return file;
}
AioFile::AioFile(AioFile&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), replaced_stale_(o.replaced_stale_) {
  o.fd_ = -1;
}
AioFile& AioFile::operator=(AioFile&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(path_, o.path_);
  std::swap(replaced_stale_, o.replaced_stale_);
  return *this;
}
AioFile::~AioFile() {
  if (fd_ < 0) return;
  // Removed while still locked: after close() another process could lock the same path and lose
  // its file to this unlink.
  ::unlink(path_.c_str());  // swap space, never read by a later run
  ::close(fd_);
}

// ---- the common part: tickets, blocks, errors --------------------------------------------------------

namespace {

std::string describe_failure(const BlockIo& b, const std::string& path, int64_t result) {
  const std::string what = std::string(b.write ? "write" : "read") + " of " + std::to_string(b.bytes) +
                           " bytes at offset " + std::to_string(b.offset) + " in " + path;
  if (result < 0) return "tessera: " + what + " failed: " + std::strerror(static_cast<int>(-result));
  return "tessera: " + what + " transferred only " + std::to_string(result) + " bytes" +
         (b.write ? " (is the disk full?)" : " (the file is shorter than what was written to it)");
}

// Bookkeeping shared by the backends: a transfer becomes a ticket and blocks of `block_size`; the
// backend moves blocks from `pending_` to the disk and calls finish() for each.
class BlockQueueIo : public AsyncIo {
 public:
  BlockQueueIo(const AioOptions& o, AioBackend kind) : options_(o), kind_(kind) {}

  Ticket read(const AioFile& f, void* buffer, int64_t bytes, int64_t offset) override {
    return enqueue(f, static_cast<char*>(buffer), bytes, offset, false);
  }
  Ticket write(const AioFile& f, const void* buffer, int64_t bytes, int64_t offset) override {
    return enqueue(f, static_cast<char*>(const_cast<void*>(buffer)), bytes, offset, true);
  }

  void wait(Ticket ticket) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // Looked up again after every wake-up: enqueue() may rehash the map while the lock is free.
    auto done = [&] {
      auto it = tickets_.find(ticket);
      return it == tickets_.end() || it->second.remaining == 0;
    };
    done_.wait(lock, done);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;  // already waited for (or by wait_all)
    const std::string error = it->second.error;
    tickets_.erase(it);
    if (!error.empty()) throw std::runtime_error(error);
  }

  void wait_all() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] {
      for (const auto& [t, s] : tickets_)
        if (s.remaining > 0) return false;
      return true;
    });
    std::string error;
    for (const auto& [t, s] : tickets_)
      if (error.empty() && !s.error.empty()) error = s.error;
    tickets_.clear();
    if (!error.empty()) throw std::runtime_error(error);
  }

  AioBackend backend() const override { return kind_; }
  int64_t bytes_read() const override { return bytes_read_.load(); }
  int64_t bytes_written() const override { return bytes_written_.load(); }

 protected:
  struct TicketState {
    int64_t remaining = 0;
    std::string path;
    std::string error;  // the first failure
  };

  // With mutex_ held: one block is over.
  void finish_locked(BlockIo* b, int64_t result) {
    TicketState& t = tickets_.at(b->ticket);
    if (result != b->bytes) {
      if (t.error.empty()) t.error = describe_failure(*b, t.path, result);
    } else {
      (b->write ? bytes_written_ : bytes_read_) += b->bytes;
    }
    --t.remaining;
    delete b;
  }

  // Stops the backend's threads: they drain what is queued first.
  void stop_and_join(std::vector<std::thread>& threads) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads) t.join();
  }

  const AioOptions options_;
  const AioBackend kind_;
  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<BlockIo*> pending_;
  bool stopping_ = false;

 private:
  Ticket enqueue(const AioFile& f, char* buffer, int64_t bytes, int64_t offset, bool write) {
    if (offset % kAioAlignment)
      throw std::invalid_argument("tessera: direct I/O offsets are multiples of 4096, not " + std::to_string(offset));
    const int64_t total = aio_aligned(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    const Ticket ticket = ++last_ticket_;
    TicketState& t = tickets_[ticket];
    t.path = f.path();
    for (int64_t done = 0; done < total; done += options_.block_size) {
      auto* b = new BlockIo{f.fd(), buffer + done, std::min(options_.block_size, total - done), offset + done, write,
                            ticket};
      pending_.push_back(b);
      ++t.remaining;
    }
    work_.notify_all();
    return ticket;
  }

  std::unordered_map<Ticket, TicketState> tickets_;
  Ticket last_ticket_ = 0;
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};
};

// io_uring and libaio: one I/O thread keeps up to queue_depth blocks in the kernel's queue.
class KernelQueueIo final : public BlockQueueIo {
 public:
  KernelQueueIo(const AioOptions& o, AioBackend kind, std::unique_ptr<aio::KernelQueue> queue)
      : BlockQueueIo(o, kind), queue_(std::move(queue)) {
    threads_.emplace_back([this] { run(); });
  }
  ~KernelQueueIo() override { stop_and_join(threads_); }

 private:
  void run() {
    int in_flight = 0;  // this thread's alone
    std::vector<BlockIo*> batch;
    std::vector<std::pair<BlockIo*, int64_t>> completed;
    for (;;) {
      batch.clear();
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !pending_.empty() || in_flight > 0; });
        if (stopping_ && pending_.empty() && in_flight == 0) return;
        while (!pending_.empty() && in_flight + static_cast<int>(batch.size()) < options_.queue_depth) {
          batch.push_back(pending_.front());
          pending_.pop_front();
        }
      }
      for (BlockIo* b : batch) {
        queue_->prepare(b);
        if (options_.single_submit) queue_->submit();
      }
      if (!batch.empty() && !options_.single_submit) queue_->submit();
      in_flight += static_cast<int>(batch.size());
      if (in_flight == 0) continue;
      completed.clear();
      queue_->reap(completed);
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [b, result] : completed) finish_locked(b, result);
      in_flight -= static_cast<int>(completed.size());
      done_.notify_all();
    }
  }

  std::unique_ptr<aio::KernelQueue> queue_;
  std::vector<std::thread> threads_;
};

// pread/pwrite on intra_op_parallelism threads, each with one block in the kernel at a time (so
// intra_op_parallelism, not queue_depth, bounds what is in flight here).
class ThreadPoolIo final : public BlockQueueIo {
 public:
  explicit ThreadPoolIo(const AioOptions& o) : BlockQueueIo(o, AioBackend::kThreads) {
    for (int i = 0; i < std::max(1, o.intra_op_parallelism); ++i) threads_.emplace_back([this] { run(); });
  }
  ~ThreadPoolIo() override { stop_and_join(threads_); }

 private:
  void run() {
    for (;;) {
      BlockIo* b;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stopping, nothing left
        b = pending_.front();
        pending_.pop_front();
      }
      int64_t done = 0, result = 0;
      while (done < b->bytes) {
        const ssize_t r = b->write ? ::pwrite(b->fd, b->buffer + done, static_cast<size_t>(b->bytes - done), b->offset + done)
                                   : ::pread(b->fd, b->buffer + done, static_cast<size_t>(b->bytes - done), b->offset + done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          result = r < 0 ? -errno : done;
          break;
        }
        done += r;
        result = done;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      finish_locked(b, result);
      done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<AsyncIo> AsyncIo::create(const AioOptions& options) {
  if (options.block_size <= 0 || options.block_size % kAioAlignment)
    throw std::invalid_argument("tessera: aio.block_size must be a positive multiple of 4096, not " +
                                std::to_string(options.block_size));
  if (options.queue_depth < 1 || options.queue_depth > 4096)
    throw std::invalid_argument("tessera: aio.queue_depth must be between 1 and 4096, not " +
                                std::to_string(options.queue_depth));
  std::optional<AioBackend> wanted = options.backend;
  if (!wanted) {
    if (const char* env = std::getenv("TESSERA_AIO_BACKEND"); env && *env) {
      wanted = parse_aio_backend(env);
      if (!wanted)
        throw std::invalid_argument(std::string("tessera: TESSERA_AIO_BACKEND=") + env +
                                    " is not one of io_uring, libaio, threads");
    }
  }
  std::string why_uring, why_libaio;
  if (!wanted || *wanted == AioBackend::kIoUring) {
    if (auto q = aio::make_io_uring_queue(options.queue_depth, why_uring))
      return std::make_unique<KernelQueueIo>(options, AioBackend::kIoUring, std::move(q));
    if (wanted) throw std::runtime_error("tessera: the io_uring backend is not available here: " + why_uring);
  }
  if (!wanted || *wanted == AioBackend::kLibaio) {
    if (auto q = aio::make_libaio_queue(options.queue_depth, why_libaio))
      return std::make_unique<KernelQueueIo>(options, AioBackend::kLibaio, std::move(q));
    if (wanted) throw std::runtime_error("tessera: the libaio backend is not available here: " + why_libaio);
  }
  return std::make_unique<ThreadPoolIo>(options);
}

}  // namespace tessera
