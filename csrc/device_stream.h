// Waiting for a device's queued work from the host: the one place outside c10d that names CUDA's
// runtime, so the layers above stay free of CUDA headers (and build the same without CUDA).
#pragma once

#include <c10/core/Device.h>

namespace tessera {

// Blocks until everything queued on `device`'s current stream has run (its asynchronous copies
// to and from pinned host memory included). Nothing for the CPU.
void wait_for_device_stream(c10::Device device);

}  // namespace tessera
