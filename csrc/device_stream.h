// Waiting for a device's queued work from the host: the one place outside c10d that names CUDA's
// runtime, so the layers above stay free of CUDA headers (and build the same without CUDA).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace tessera {

// Blocks until everything queued on `device`'s current stream has run (its asynchronous copies
// to and from pinned host memory included). Nothing for the CPU.
void wait_for_device_stream(c10::Device device);

// A point in `device`'s current stream, recorded now: wait() blocks the calling thread (any thread)
// until the work queued on that stream before it has run. Empty for the CPU (wait() returns at once).
class DeviceEvent {
 public:
  static DeviceEvent record(c10::Device device);
  void wait() const;

 private:
  std::shared_ptr<void> event_;  // the CUDA event, destroyed with its last copy
};

// The device allocator's bytes (torch's caching allocator, which the engine's buffers come from):
// allocated and reserved now and at their peak. Zeros for the CPU (or a build without CUDA).
struct DeviceMemory {
  int64_t allocated = 0, peak_allocated = 0, reserved = 0, peak_reserved = 0;
};
DeviceMemory device_memory(c10::Device device);

// The CUDA devices this process sees (0 without CUDA, a GPU or a driver).
int cuda_device_count();

}  // namespace tessera
