#include "offload/swap_directory.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <stdexcept>

namespace tessera {

void check_swap_directory(const std::string& key, const std::string& dir, int64_t needed_bytes, const std::string& what) {
  struct stat st {};
  if (dir.empty()) throw std::invalid_argument("tessera: " + key + " is not set");
  if (::stat(dir.c_str(), &st) != 0) throw std::runtime_error("tessera: " + key + " " + dir + " does not exist");
  if (!S_ISDIR(st.st_mode)) throw std::runtime_error("tessera: " + key + " " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) throw std::runtime_error("tessera: " + key + " " + dir + " is not writable");
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    if (needed_bytes > free_bytes)
      throw std::runtime_error("tessera: " + key + " " + dir + " has " + std::to_string(free_bytes) + " bytes free; " +
                               what + " need " + std::to_string(needed_bytes));
  }
}

}  // namespace tessera
