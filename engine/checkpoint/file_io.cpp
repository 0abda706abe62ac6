#include "engine/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw os_error("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw os_error("fsync of", path);
}

}  // namespace tessera::checkpoint
