#include "csrc/device_stream.h"

#include <stdexcept>

#ifdef TESSERA_WITH_CUDA
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

}  // namespace tessera
