#include "csrc/device_stream.h"

#include <stdexcept>

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera {

void wait_for_device_stream(c10::Device device) {
  if (!device.is_cuda()) return;
#ifdef TESSERA_WITH_CUDA
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  throw std::runtime_error("this tessera was built without CUDA: cannot wait for " + device.str());
#endif
}

int cuda_device_count() {
#ifdef TESSERA_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

DeviceMemory device_memory(c10::Device device) {
  DeviceMemory m;
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const size_t all = 0;  // StatType::AGGREGATE: every pool
    m = {stats.allocated_bytes[all].current, stats.allocated_bytes[all].peak, stats.reserved_bytes[all].current,
         stats.reserved_bytes[all].peak};
  }
#endif
  return m;
}

}  // namespace tessera
