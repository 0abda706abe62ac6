#include "parallel/pipeline/p2p.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <stdexcept>
#include <string>

namespace tessera::pipeline {

StageLink::StageLink(Communicator& pipe, bool dynamic_shape) : pipe_(pipe), dynamic_shape_(dynamic_shape) {}

namespace {
int tag_of(int tag, Stream stream, int gradient_offset) { return stream == Stream::Gradient ? tag + gradient_offset : tag; }
const char* stream_name(Stream stream) { return stream == Stream::Gradient ? "gradient" : "tensor"; }
}  // namespace

void StageLink::send(const at::Tensor& tensor, int peer, Stream stream) {
  at::Tensor data = tensor.detach().contiguous();
  if (data.dim() > kMaxDims)
    throw std::invalid_argument("pipeline: a stage's output has " + std::to_string(data.dim()) + " dimensions; at most " +
                                std::to_string(kMaxDims) + " cross a stage boundary");
  const Key key{peer, stream};
  auto known = sent_shape_.find(key);
  const bool same = known != sent_shape_.end() && known->second.sizes == data.sizes().vec() &&
                    known->second.dtype == data.scalar_type();
  if (!same && known != sent_shape_.end() && !dynamic_shape_)
    throw std::invalid_argument(std::string("pipeline: the ") + stream_name(stream) + " sent to stage " +
                                std::to_string(peer) + " changed from shape " +
                                c10::str(at::IntArrayRef(known->second.sizes)) + " to " + c10::str(data.sizes()) +
                                " (or its dtype changed); set pipeline.dynamic_shape to true when shapes vary");
  if (known == sent_shape_.end() || dynamic_shape_) {
    // Header: [dims, dtype, size 0, ..., size dims-1, 0 ...]
    at::Tensor header = at::zeros({kMaxDims + 2}, at::kLong);
    int64_t* h = header.data_ptr<int64_t>();
    h[0] = data.dim();
    h[1] = static_cast<int64_t>(data.scalar_type());
    for (int64_t d = 0; d < data.dim(); ++d) h[2 + d] = data.size(d);
    header = header.to(pipe_.device());
    in_flight_.push_back({header, pipe_.send_async(header, peer, tag_of(kHeaderTag, stream, kGradientTags))});
    sent_shape_[key] = {data.sizes().vec(), data.scalar_type()};
  }
  bytes_sent_ += static_cast<int64_t>(data.nbytes());
  in_flight_.push_back({data, pipe_.send_async(data, peer, tag_of(kDataTag, stream, kGradientTags))});
}

at::Tensor StageLink::recv(int peer, Stream stream) {
  const Key key{peer, stream};
  if (auto ahead = posted_.find(key); ahead != posted_.end() && !ahead->second.empty()) {
    InFlight next = std::move(ahead->second.front());
    ahead->second.pop_front();
    next.handle.wait();
    bytes_received_ += static_cast<int64_t>(next.tensor.nbytes());
    return next.tensor;
  }
  auto known = received_shape_.find(key);
  if (known == received_shape_.end() || dynamic_shape_) {
    at::Tensor header = at::empty({kMaxDims + 2}, at::TensorOptions().dtype(at::kLong).device(pipe_.device()));
    pipe_.recv(header, peer, tag_of(kHeaderTag, stream, kGradientTags));
    at::Tensor h = header.cpu();
    const int64_t* v = h.data_ptr<int64_t>();
    Shape shape{std::vector<int64_t>(v + 2, v + 2 + v[0]), static_cast<at::ScalarType>(v[1])};
    known = received_shape_.insert_or_assign(key, shape).first;
  }
  at::Tensor data = at::empty(known->second.sizes, at::TensorOptions().dtype(known->second.dtype).device(pipe_.device()));
  pipe_.recv(data, peer, tag_of(kDataTag, stream, kGradientTags));
  bytes_received_ += static_cast<int64_t>(data.nbytes());
  return data;
}

void StageLink::post_recv(int peer, Stream stream) {
  const Key key{peer, stream};
  const auto known = received_shape_.find(key);
  if (dynamic_shape_ || known == received_shape_.end()) return;
  at::Tensor data = at::empty(known->second.sizes, at::TensorOptions().dtype(known->second.dtype).device(pipe_.device()));
  CommHandle handle = pipe_.recv_async(data, peer, tag_of(kDataTag, stream, kGradientTags));
  posted_[key].push_back({data, std::move(handle)});
}

int StageLink::posted() const {
  int n = 0;
  for (const auto& [key, queue] : posted_) n += static_cast<int>(queue.size());
  return n;
}

void StageLink::wait_sends() {
  for (InFlight& f : in_flight_) f.handle.wait();
  in_flight_.clear();
}

}  // namespace tessera::pipeline
