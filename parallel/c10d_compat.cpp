#include "parallel/c10d_compat.h"

#include <cstdlib>
#include <type_traits>

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

namespace {
// `&ProcessGroupGloo::_reduce_scatter_base` names ProcessGroupGloo's own member only when the class
// declares one; an inherited member's address has Backend's member-pointer type instead.
using GlooReduceScatterBase = c10::intrusive_ptr<c10d::Work> (c10d::ProcessGroupGloo::*)(
    at::Tensor&, at::Tensor&, const c10d::ReduceScatterOptions&);
constexpr bool kGlooHasReduceScatterBase =
    std::is_same_v<decltype(&c10d::ProcessGroupGloo::_reduce_scatter_base), GlooReduceScatterBase>;
}  // namespace

bool has_native_reduce_scatter(BackendKind kind) {
  return kind == BackendKind::Nccl || kGlooHasReduceScatterBase;
}

c10::Device collective_device(BackendKind kind, int local_rank) {
  if (kind == BackendKind::Nccl) return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(local_rank));
  return c10::Device(c10::DeviceType::CPU);
}

void set_current_device(c10::Device device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  if (device.is_cuda()) throw std::runtime_error("this tessera was built without CUDA: no " + device.str());
#endif
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace tessera
