// The only place that knows c10d's backend classes and how they differ between PyTorch versions.
// Everything else talks to a plain c10d::Backend through parallel/communicator.h.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tessera {

enum class BackendKind { Gloo, Nccl };
const char* backend_name(BackendKind kind);

// Whether this build can create NCCL groups (CUDA LibTorch) and a GPU is present.
bool nccl_available();

// A backend over `store` for a group of `size` ranks in which this process is `rank`.
c10::intrusive_ptr<c10d::Backend> make_backend(BackendKind kind, const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size, std::chrono::milliseconds timeout);

// Whether the backend has a native flat reduce-scatter (`_reduce_scatter_base`): NCCL always; Gloo
// when the ProcessGroupGloo this was compiled against declares one (decided at compile time from
// the class itself, never by reading an error message).
bool has_native_reduce_scatter(BackendKind kind);

// The device a backend's collectives take their tensors on: CUDA device `local_rank` for NCCL,
// the CPU for Gloo.
c10::Device collective_device(BackendKind kind, int local_rank);

// Makes `device` current for this process when it is a CUDA device (NCCL binds its groups to the
// current device; the engine's buffers go there); nothing for the CPU or without CUDA.
void set_current_device(c10::Device device);

// An exception's message without the C++ backtrace that torch's own errors (c10::Error) carry.
std::string message_of(const std::exception& e);

}  // namespace tessera
