// Tensors between neighbouring pipeline stages over the pipe group's Communicator: activations go
// to the next stage, their gradients come back. Sends are asynchronous (the schedule never waits on
// one); a receive blocks. The receiver learns a stream's shape and dtype from a small header sent
// before its first tensor, or before every tensor with `dynamic_shape` (pipeline.dynamic_shape).
//
// Each direction of each link carries two ordered streams, activations and gradients, each on tags
// of its own (c10d matches a peer's sends and receives of one tag in order), so a tensor needs no
// micro-batch id on the wire: the schedule fixes each stream's order (simulator.h's check() proves
// the sender's and receiver's orders agree). Two streams, because with interleaved schedules one
// direction carries both: the last stage sends activations to the first (the wrap-around to its
// next chunk) as well as gradients back to its neighbour.
//
// A receive can be posted ahead (post_recv) once its stream's shape is known: the transfer then
// lands while the stage computes, instead of starting when the stage asks for it (Gloo moves a
// large message only once its receive is posted; measured at pp 2 on 2 cores, 2-5 ms a receive
// whose data had long been sent: docs/pipeline.md). For tag-matched transports (Gloo): NCCL
// matches a pair's messages in issue order, so the executor posts ahead only on host groups.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <map>
#include <vector>

#include "parallel/communicator.h"

namespace tessera::pipeline {

enum class Stream { Activation, Gradient };

class StageLink {
 public:
  StageLink(Communicator& pipe, bool dynamic_shape);
  // Sends `tensor` (kept alive until the send completes) to stage `peer` on `stream`.
  void send(const at::Tensor& tensor, int peer, Stream stream);
  // The next tensor stage `peer` sends here on `stream`, in a buffer of its own (the oldest posted
  // one when post_recv posted it).
  at::Tensor recv(int peer, Stream stream);
  // Posts the next receive on (peer, stream) now, for a later recv() to return; nothing when the
  // stream's shape is not known yet (before its first tensor) or shapes vary (dynamic_shape: each
  // tensor's header decides its buffer). The caller posts only receives it will make.
  void post_recv(int peer, Stream stream);
  // Receives posted and not yet returned by recv().
  int posted() const;
  // Waits for every send in flight (before their tensors may change, and at the end of a batch).
  void wait_sends();
  // Bytes of tensors (headers excluded) sent and received since construction.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  static constexpr int kMaxDims = 8;
  // Tags: a stream's header and data; the gradient stream's are kGradientTags above the activation's.
  static constexpr int kHeaderTag = 1, kDataTag = 2, kGradientTags = 2;
  using Key = std::pair<int, Stream>;  // (peer, stream)
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
  std::map<Key, Shape> sent_shape_, received_shape_;  // by peer and stream: the shape the stream carries
  std::vector<InFlight> in_flight_;
  std::map<Key, std::deque<InFlight>> posted_;  // receives posted ahead, oldest first
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace tessera::pipeline
