#include "engine/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace tessera::checkpoint {

namespace {
constexpr int64_t kMaxTransfer = int64_t(1) << 30;  // per system call
}

std::runtime_error os_error(const std::string& what, const std::string& path) {
  return std::runtime_error("tessera: " + what + " " + path + ": " + std::strerror(errno));
}

void write_all(int fd, const char* data, int64_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, static_cast<size_t>(std::min(n, kMaxTransfer)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw os_error("writing", path);
    data += w;
    n -= w;
  }
}

void read_all(int fd, char* data, int64_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, static_cast<size_t>(std::min(n, kMaxTransfer)), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw os_error("reading", path);
    if (r == 0) throw std::runtime_error("tessera: " + path + " ends early (truncated?)");
    data += r;
    n -= r;
    offset += r;
  }
}

namespace {

void write_buffered(const std::string& path, const char* data, int64_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot create", path);
  try {
    write_all(fd, data, size, path);
    if (::fsync(fd) != 0) throw os_error("fsync of", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw os_error("closing", path);
}

}  // namespace

bool write_file_direct(const std::string& path, const char* data, int64_t size) {
  if (reinterpret_cast<uintptr_t>(data) % kAioAlignment != 0) {
    write_buffered(path, data, size);
    return false;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) {  // the file system has no direct I/O
    write_buffered(path, data, size);
    return false;
  }
  if (fd < 0) throw os_error("cannot create", path);
  // Transfers of 64 MiB: large enough that the device queues many requests from each.
  constexpr int64_t kTransfer = int64_t(64) << 20;
  const int64_t whole = aio_aligned(size);
  try {
    for (int64_t offset = 0; offset < whole;) {
      const ssize_t w = ::pwrite(fd, data + offset, static_cast<size_t>(std::min(kTransfer, whole - offset)), offset);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && offset == 0) {  // accepted at open, refused at the write
        ::close(fd);
        write_buffered(path, data, size);
        return false;
      }
      if (w <= 0) throw os_error("writing", path);
      offset += w;
    }
    if (::ftruncate(fd, size) != 0) throw os_error("cannot set the length of", path);
    if (::fsync(fd) != 0) throw os_error("fsync of", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw os_error("closing", path);
  return true;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw os_error("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw os_error("fsync of", path);
}

}  // namespace tessera::checkpoint
