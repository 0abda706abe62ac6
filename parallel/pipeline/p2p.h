// Tensors between neighbouring pipeline stages over the pipe group's Communicator: activations go
// to the next stage, their gradients come back. Sends are asynchronous (the schedule never waits on
// one); a receive blocks. The receiver learns a stream's shape and dtype from a small header sent
// before its first tensor, or before every tensor with `dynamic_shape` (pipeline.dynamic_shape).
//
// Each direction of each link is one ordered stream (c10d matches a peer's sends and receives of
// one tag in order), so a tensor needs no micro-batch id on the wire: the schedule fixes the order.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <vector>

#include "parallel/communicator.h"

namespace tessera::pipeline {

class StageLink {
 public:
  StageLink(Communicator& pipe, bool dynamic_shape);
  // Sends `tensor` (kept alive until the send completes) to stage `peer`.
  void send(const at::Tensor& tensor, int peer);
  // The next tensor stage `peer` sends here, in a buffer of its own.
  at::Tensor recv(int peer);
  // Waits for every send in flight (before their tensors may change, and at the end of a batch).
  void wait_sends();
  // Bytes of tensors (headers excluded) sent and received since construction.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  static constexpr int kMaxDims = 8;
  static constexpr int kHeaderTag = 1, kDataTag = 2;
  struct Shape {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
  };
  struct InFlight {
    at::Tensor tensor;
    CommHandle handle;
  };
  Communicator& pipe_;
  bool dynamic_shape_;
  std::map<int, Shape> sent_shape_, received_shape_;  // by peer: the shape its stream carries
  std::vector<InFlight> in_flight_;
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace tessera::pipeline
