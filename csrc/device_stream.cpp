#include "csrc/device_stream.h"

#include <stdexcept>

#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
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

DeviceEvent DeviceEvent::record(c10::Device device) {
  DeviceEvent e;
  if (!device.is_cuda()) return e;
#ifdef TESSERA_WITH_CUDA
  cudaEvent_t event = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  e.event_ = std::shared_ptr<void>(event, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  C10_CUDA_CHECK(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(device.index()).stream()));
#else
  throw std::runtime_error("this tessera was built without CUDA: cannot record an event on " + device.str());
#endif
  return e;
}

void DeviceEvent::wait() const {
#ifdef TESSERA_WITH_CUDA
  if (event_) C10_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_.get())));
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
