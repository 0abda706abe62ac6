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

// The 1-bit compression of t: its packed signs (t.numel() / 8 bytes) and scale ‖t‖/√len.
// `error` (as long as t) receives what the compression lost, t − scale·sign(t).
struct Compressed {
  at::Tensor bits;
  float scale = 0;
};

Compressed compress(const at::Tensor& t, at::Tensor& error) {
  Compressed c;
  c.scale = static_cast<float>(t.norm().item<double>() / std::sqrt(static_cast<double>(t.numel())));
  c.bits = at::empty({t.numel() / 8}, t.options().dtype(at::kByte));
  pack_signs(t.data_ptr<float>(), t.numel(), c.bits.data_ptr<uint8_t>());
  unpack_signs(c.bits.data_ptr<uint8_t>(), t.numel(), c.scale, error.data_ptr<float>());
  error.neg_().add_(t);
  return c;
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
  const Compressed worker = compress(b, errors.worker);

  // Chunk j of the signs to rank j; every rank's scale to everyone.
  at::Tensor received = at::empty({padded / 8}, worker.bits.options());
  group.all_to_all(worker.bits, received);
  at::Tensor my_scale = at::full({1}, worker.scale, f32), scales = at::empty({p}, f32);
  group.all_gather(my_scale, scales);

  // Server: average my chunk over the ranks, compensate with my server error, compress again.
  at::Tensor c = at::zeros({chunk}, f32), decoded = at::empty({chunk}, f32);
  for (int j = 0; j < p; ++j) {
    unpack_signs(received.data_ptr<uint8_t>() + j * chunk / 8, chunk, scales.data_ptr<float>()[j],
                 decoded.data_ptr<float>());
    c.add_(decoded);
  }
  c.mul_(1.0 / p).add_(errors.server);
  const Compressed server = compress(c, errors.server);

  // Everyone gets every server's chunk, decoded straight into x's padded copy.
  at::Tensor all_bits = at::empty({padded / 8}, server.bits.options());
  group.all_gather(server.bits, all_bits);
  at::Tensor server_scale = at::full({1}, server.scale, f32), server_scales = at::empty({p}, f32);
  group.all_gather(server_scale, server_scales);
  at::Tensor result = at::empty({padded}, f32);
  for (int j = 0; j < p; ++j)
    unpack_signs(all_bits.data_ptr<uint8_t>() + j * chunk / 8, chunk, server_scales.data_ptr<float>()[j],
                 result.data_ptr<float>() + j * chunk);
  x.reshape({-1}).copy_(result.narrow(0, 0, n));
}

}  // namespace tessera
