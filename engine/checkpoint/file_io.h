// The plain POSIX file operations checkpoint files are made of: whole writes and positioned reads
// that retry when interrupted, fsync of a file or directory by path; each failure a
// std::runtime_error naming the path and the system's reason.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tessera::checkpoint {

// "tessera: <what> <path>: <strerror(errno)>".
std::runtime_error os_error(const std::string& what, const std::string& path);

// All n bytes to fd (a file at `path`, for the message).
void write_all(int fd, const char* data, int64_t n, const std::string& path);
// n bytes at `offset` of fd; a file that ends first is an error ("truncated?").
void read_all(int fd, char* data, int64_t n, int64_t offset, const std::string& path);
// fsync of the file or directory at `path`.
void fsync_path(const std::string& path);

}  // namespace tessera::checkpoint
