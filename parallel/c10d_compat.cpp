#include "parallel/c10d_compat.h"

#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef TESSERA_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tessera {

const char* backend_name(BackendKind kind) { return kind == BackendKind::Nccl ? "nccl" : "gloo"; }

bool nccl_available() {
#ifdef TESSERA_WITH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::Backend> make_backend(BackendKind kind, const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size, std::chrono::milliseconds timeout) {
  if (kind == BackendKind::Nccl) {
#ifdef TESSERA_WITH_CUDA
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
    throw std::runtime_error("this tessera was built without CUDA: NCCL is not available (use gloo)");
#endif
  }
  // Gloo's devices are pointers to gloo types; only c10d's own factory touches them.
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  }
  // Gloo's worker threads per group (torch.distributed's default, 2): two buckets in flight can
  // progress at once, which keeps the reduction of the last buckets short after backward.
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

bool is_unsupported_collective(const std::exception& e) {
  std::string what = e.what();
  return what.find("does not support") != std::string::npos || what.find("not supported") != std::string::npos;
}

}  // namespace tessera
