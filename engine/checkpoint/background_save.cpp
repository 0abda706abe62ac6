#include "engine/checkpoint/background_save.h"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace tessera {

BackgroundSave::BackgroundSave(std::string path, int64_t host_bytes, std::function<void()> write)
    : path_(std::move(path)), host_bytes_(host_bytes) {
  thread_ = std::thread([this, write = std::move(write)] {
    const auto start = std::chrono::steady_clock::now();
    try {
      write();
    } catch (...) {
      error_ = std::current_exception();
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done_ = true;
  });
}

void BackgroundSave::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

BackgroundSave::~BackgroundSave() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[tessera] the background save of %s failed: %s\n", path_.c_str(), e.what());
  }
}

}  // namespace tessera
