#include "parallel/compressed_allreduce.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "csrc/sign_pack.h"
#include "parallel/communicator.h"

namespace tessera {

namespace {

// s·sign(t) for the packed signs of t, and the scale ‖t‖/√len: the 1-bit compression of t.
struct Compressed {
  at::Tensor bits;  // len / 8 bytes
  float scale = 0;
};

Compressed compress(const at::Tensor& t) {
  Compressed c;
  c.scale = static_cast<float>(t.norm().item<double>() / std::sqrt(static_cast<double>(t.numel())));
  c.bits = at::empty({t.numel() / 8}, t.options().dtype(at::kByte));
  pack_signs(t.data_ptr<float>(), t.numel(), c.bits.data_ptr<uint8_t>());
  return c;
}

at::Tensor decompress(const uint8_t* bits, int64_t len, float scale, const at::TensorOptions& options) {
  at::Tensor out = at::empty({len}, options);
  unpack_signs(bits, len, scale, out.data_ptr<float>());
  return out;
}

}  // namespace

int64_t compressed_padded_size(int64_t n, int ranks) {
  const int64_t unit = 8 * static_cast<int64_t>(ranks);
  return (n + unit - 1) / unit * unit;
}

CompressionErrors CompressionErrors::zeros(int64_t n, const Communicator& group) {
  const int64_t padded = compressed_padded_size(n, group.size());
  return {at::zeros({padded}, group.options(at::kFloat)), at::zeros({padded / group.size()}, group.options(at::kFloat))};
}

void compressed_allreduce(at::Tensor& x, CompressionErrors& errors, Communicator& group) {
  const int p = group.size();
  const int64_t n = x.numel(), padded = compressed_padded_size(n, p), chunk = padded / p;
  if (x.scalar_type() != at::kFloat || !x.is_contiguous() || !x.device().is_cpu())
    throw std::invalid_argument("compressed_allreduce: expects a contiguous fp32 CPU tensor, got " +
                                std::string(x.dtype().name()) + " on " + x.device().str());
  if (errors.worker.numel() != padded || errors.server.numel() != chunk)
    throw std::invalid_argument("compressed_allreduce: error buffers of " + std::to_string(errors.worker.numel()) + " and " +
                                std::to_string(errors.server.numel()) + " elements for a tensor of " + std::to_string(n) +
                                " on " + std::to_string(p) + " ranks (expected " + std::to_string(padded) + " and " +
                                std::to_string(chunk) + ")");
  const auto f32 = x.options();

  // Worker: compensate, compress, keep what was lost.
  at::Tensor b = errors.worker.clone();
  b.narrow(0, 0, n).add_(x.reshape({-1}));
  Compressed worker = compress(b);
  errors.worker.copy_(b.sub_(decompress(worker.bits.data_ptr<uint8_t>(), padded, worker.scale, f32)));

  // Chunk j of the signs to rank j; every rank's scale to everyone.
  at::Tensor received = at::empty({padded / 8}, worker.bits.options());
  group.all_to_all(worker.bits, received);
  at::Tensor my_scale = at::full({1}, worker.scale, f32), scales = at::empty({p}, f32);
  group.all_gather(my_scale, scales);

  // Server: average my chunk over the ranks, compensate with my server error, compress again.
  at::Tensor c = at::zeros({chunk}, f32);
  const uint8_t* from = received.data_ptr<uint8_t>();
  for (int j = 0; j < p; ++j) c.add_(decompress(from + j * chunk / 8, chunk, scales[j].item<float>(), f32));
  c.mul_(1.0 / p).add_(errors.server);
  Compressed server = compress(c);
  errors.server.copy_(c.sub_(decompress(server.bits.data_ptr<uint8_t>(), chunk, server.scale, f32)));

  // Everyone gets every server's chunk.
  at::Tensor all_bits = at::empty({padded / 8}, server.bits.options());
  group.all_gather(server.bits, all_bits);
  at::Tensor server_scale = at::full({1}, server.scale, f32), server_scales = at::empty({p}, f32);
  group.all_gather(server_scale, server_scales);
  at::Tensor result = at::empty({padded}, f32);
  for (int j = 0; j < p; ++j)
    unpack_signs(all_bits.data_ptr<uint8_t>() + j * chunk / 8, chunk, server_scales[j].item<float>(),
                 result.data_ptr<float>() + j * chunk);
  x.reshape({-1}).copy_(result.narrow(0, 0, n));
}

}  // namespace tessera
