#include "engine/checkpoint/checkpoint_dir.h"

#include "engine/checkpoint/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace tessera::checkpoint {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  std::string prefix;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    prefix = path.substr(0, slash);
    if (!prefix.empty() && !is_directory(prefix) && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      throw os_error("cannot create the directory", prefix);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

// Removes `path` and everything under it (std::filesystem::remove_all is not used: the torch 2.11
// wheel's libtorch.so exports a broken copy of it).
void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* dir = ::opendir(path.c_str())) {
      while (dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") remove_tree(path + "/" + name);
      }
      ::closedir(dir);
    }
    if (::rmdir(path.c_str()) != 0) throw os_error("cannot remove", path);
  } else if (::unlink(path.c_str()) != 0) {
    throw os_error("cannot remove", path);
  }
}

}  // namespace

void crash_point(const std::string& at, const char* point) {
  if (!at.empty() && at == point) ::raise(SIGKILL);
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.' || tag == "latest" || tag == "latest.tmp")
    throw std::invalid_argument("tessera: checkpoint tag \"" + tag +
                                "\" must be one path component, not starting with '.' and not \"latest\"");
}

void write_file_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot create", tmp);
  try {
    write_all(fd, text.data(), static_cast<int64_t>(text.size()), tmp);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  if (!synced) {
    const auto error = os_error("fsync of", tmp);
    ::close(fd);
    throw error;
  }
  if (::close(fd) != 0) throw os_error("closing", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw os_error("cannot rename " + tmp + " to", path);
  const size_t slash = path.rfind('/');
  fsync_path(slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash));
}

std::string partial_dir_of(const std::string& save_dir, const std::string& tag) { return save_dir + "/." + tag + ".partial"; }

CheckpointWriter::CheckpointWriter(std::string save_dir, std::string tag, std::string crash_at)
    : crash_at_(std::move(crash_at)), save_dir_(std::move(save_dir)), tag_(std::move(tag)) {
  check_tag(tag_);
  make_directories(save_dir_);
  partial_ = partial_dir_of(save_dir_, tag_);
  remove_tree(partial_);  // a save of this tag that never committed
  if (::mkdir(partial_.c_str(), 0755) != 0) throw os_error("cannot create the directory", partial_);
}

CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::commit() {
  if (committed_) throw std::logic_error("tessera: checkpoint " + tag_ + " committed twice");
  crash_point(crash_at_, "before_commit");
  fsync_path(partial_);
  crash_point(crash_at_, "after_fsync");
  const std::string final_path = save_dir_ + "/" + tag_;
  // A complete checkpoint of the same tag is moved aside, not deleted, until the new one is in place.
  const std::string old = save_dir_ + "/." + tag_ + ".replaced";
  remove_tree(old);
  if (exists(final_path) && ::rename(final_path.c_str(), old.c_str()) != 0) throw os_error("cannot move aside", final_path);
  if (::rename(partial_.c_str(), final_path.c_str()) != 0) throw os_error("cannot rename " + partial_ + " to", final_path);
  fsync_path(save_dir_);
  crash_point(crash_at_, "after_rename");
  write_file_durably(save_dir_ + "/latest", tag_);
  crash_point(crash_at_, "after_latest");
  remove_tree(old);
  committed_ = true;
}

std::string read_latest(const std::string& save_dir) {
  const std::string path = save_dir + "/latest";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("tessera: no checkpoint in " + save_dir + " (" + path + ": " + std::strerror(errno) + ")");
  char buffer[4096];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  ::close(fd);
  std::string tag(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) throw std::runtime_error("tessera: " + path + " is empty");
  if (!is_directory(save_dir + "/" + tag))
    throw std::runtime_error("tessera: " + path + " names \"" + tag + "\", which is not a directory in " + save_dir);
  return tag;
}

std::string checkpoint_path(const std::string& save_dir, const std::string& tag) {
  const std::string name = tag.empty() ? read_latest(save_dir) : tag;
  check_tag(name);
  const std::string path = save_dir + "/" + name;
  if (!is_directory(path)) throw std::runtime_error("tessera: no checkpoint \"" + name + "\" in " + save_dir);
  return path;
}

}  // namespace tessera::checkpoint
