// The plain POSIX file operations checkpoint files are made of: whole writes and positioned reads
// that retry when interrupted, fsync of a file or directory by path; each failure a
// std::runtime_error naming the path and the system's reason.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "csrc/aio/async_io.h"

namespace tessera::checkpoint {

// "tessera: <what> <path>: <strerror(errno)>".
std::runtime_error os_error(const std::string& what, const std::string& path);

// All n bytes to fd (a file at `path`, for the message).
void write_all(int fd, const char* data, int64_t n, const std::string& path);
// n bytes at `offset` of fd; a file that ends first is an error ("truncated?").
void read_all(int fd, char* data, int64_t n, int64_t offset, const std::string& path);
// fsync of the file or directory at `path`.
void fsync_path(const std::string& path);

// A new file at `path` holding the first `size` bytes of `data`, written with O_DIRECT (the page
// cache neither copies the bytes nor keeps them: the disk reads them from `data` itself) and
// fsynced. `data` must be aligned to kAioAlignment (csrc/aio/async_io.h: O_DIRECT's alignment, as
// for NVMe offload) and readable for aio_aligned(size) bytes: the tail is written, then cut off. Where the file system refuses O_DIRECT (tmpfs) or `data` is
// not aligned, ordinary writes. Returns whether the writes were direct.
bool write_file_direct(const std::string& path, const char* data, int64_t size);

}  // namespace tessera::checkpoint
