#include "parallel/compressed_allreduce.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "csrc/sign_pack.h"
#include "parallel/communicator.h"

namespace tessera {

namespace {

// The scale blocks over the padded buffer: block b is [start[b], start[b + 1]).
struct Blocks {
  std::vector<int64_t> start;  // count() + 1 entries, the last one the padded size
  int count() const { return static_cast<int>(start.size()) - 1; }

  // f(block, begin, end) for each block's piece inside [lo, hi), in order.
  template <class F>
  void for_each_piece(int64_t lo, int64_t hi, F f) const {
    int b = static_cast<int>(std::upper_bound(start.begin(), start.end() - 1, lo) - start.begin()) - 1;
    for (; b < count() && start[b] < hi; ++b) f(b, std::max(lo, start[b]), std::min(hi, start[b + 1]));
  }
};

Blocks make_blocks(const std::vector<int64_t>& starts, int64_t n, int64_t padded) {
  Blocks blocks;
  blocks.start = starts.empty() ? std::vector<int64_t>{0} : starts;
  if (blocks.start.front() != 0)
    throw std::invalid_argument("compressed_allreduce: the first scale block must start at 0, not " +
                                std::to_string(blocks.start.front()));
  for (size_t i = 1; i < blocks.start.size(); ++i)
    if (blocks.start[i] <= blocks.start[i - 1] || blocks.start[i] >= n)
      throw std::invalid_argument("compressed_allreduce: scale block " + std::to_string(i) + " starts at " +
                                  std::to_string(blocks.start[i]) + "; starts must ascend and stay below " +
                                  std::to_string(n) + " elements");
  blocks.start.push_back(padded);
  return blocks;
}

// The packing: csrc/sign_pack.h's kernels on CPU tensors; ATen operations elsewhere (a GPU), in the
// same wire format, which TESSERA_COMPRESSION_ATEN=1 also selects on the CPU (the tests run both).
bool use_aten(const at::Tensor& t) {
  static const bool forced = [] {
    const char* v = std::getenv("TESSERA_COMPRESSION_ATEN");
    return v && *v && std::string(v) != "0";
  }();
  return !t.is_cpu() || forced;
}

// The signs of t (numel a multiple of 8), 8 to a byte: bit i of byte k is t[8k + i] >= 0.
at::Tensor pack(const at::Tensor& t) {
  if (!use_aten(t)) {
    at::Tensor bits = at::empty({t.numel() / 8}, t.options().dtype(at::kByte));
    pack_signs(t.data_ptr<float>(), t.numel(), bits.data_ptr<uint8_t>());
    return bits;
  }
  const at::Tensor weights = at::arange(8, t.options().dtype(at::kLong)).exp2().to(at::kByte);  // 1, 2, ..., 128
  return t.ge(0).view({-1, 8}).to(at::kByte).mul(weights).sum(1, /*keepdim=*/false, at::kByte);
}

// out[i] = +1 or -1 by bit i of `bits` (out.numel() a multiple of 8).
void unpack(const at::Tensor& bits, at::Tensor& out) {
  if (!use_aten(out)) {
    unpack_signs(bits.data_ptr<uint8_t>(), out.numel(), 1.0f, out.data_ptr<float>());
    return;
  }
  const at::Tensor shifts = at::arange(8, bits.options().dtype(at::kByte));
  at::Tensor ones = bits.view({-1, 1}).bitwise_right_shift(shifts).bitwise_and(1).view({-1});
  out.copy_(ones.to(at::kFloat).mul_(2).sub_(1));
}

// The scale of each block piece inside [lo, lo + t.numel()), ‖piece‖/√len (0 for the blocks
// outside), as a float tensor of one element per block on t's device (no host read).
at::Tensor block_scales(const at::Tensor& t, int64_t lo, const Blocks& blocks) {
  at::Tensor scales = at::zeros({blocks.count()}, t.options());
  blocks.for_each_piece(lo, lo + t.numel(), [&](int b, int64_t begin, int64_t end) {
    scales.narrow(0, b, 1).copy_(t.narrow(0, begin - lo, end - begin).norm().div(std::sqrt(double(end - begin))));
  });
  return scales;
}

// out (the ±1 of elements [lo, lo + out.numel())) times the scale of each element's block.
void apply_scales(at::Tensor& out, int64_t lo, const Blocks& blocks, const at::Tensor& scales) {
  blocks.for_each_piece(lo, lo + out.numel(), [&](int b, int64_t begin, int64_t end) {
    out.narrow(0, begin - lo, end - begin).mul_(scales.select(0, b));
  });
}

// The 1-bit compression of t, which holds elements [lo, lo + t.numel()) of the buffer: its packed
// signs, and in `scales` one per block (block_scales). `error` (as long as t) receives t − the
// decoded value.
at::Tensor compress(const at::Tensor& t, int64_t lo, const Blocks& blocks, at::Tensor& scales, at::Tensor& error) {
  at::Tensor bits = pack(t);
  scales = block_scales(t, lo, blocks);
  unpack(bits, error);
  apply_scales(error, lo, blocks, scales);
  error.neg_().add_(t);
  return bits;
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

void compressed_allreduce(at::Tensor& x, CompressionErrors& errors, Communicator& group,
                          const std::vector<int64_t>& block_starts) {
  const int p = group.size(), me = group.rank();
  const int64_t n = x.numel(), padded = compressed_padded_size(n, p), chunk = padded / p;
  if (x.scalar_type() != at::kFloat || !x.is_contiguous())
    throw std::invalid_argument("compressed_allreduce: expects a contiguous fp32 tensor, got " +
                                std::string(x.dtype().name()) + (x.is_contiguous() ? "" : " (not contiguous)"));
  if (errors.worker.numel() != padded || errors.server.numel() != chunk)
    throw std::invalid_argument("compressed_allreduce: error buffers of " + std::to_string(errors.worker.numel()) + " and " +
                                std::to_string(errors.server.numel()) + " elements for a tensor of " + std::to_string(n) +
                                " on " + std::to_string(p) + " ranks (expected " + std::to_string(padded) + " and " +
                                std::to_string(chunk) + ")");
  const Blocks blocks = make_blocks(block_starts, n, padded);
  const int B = blocks.count();
  const auto f32 = x.options();

  // Worker: compensate, compress, keep what was lost.
  at::Tensor b = errors.worker.clone();
  b.narrow(0, 0, n).add_(x.reshape({-1}));
  at::Tensor worker_scales;
  const at::Tensor worker_bits = compress(b, 0, blocks, worker_scales, errors.worker);

  // Chunk j of the signs to rank j; every rank's scales to everyone.
  at::Tensor received = at::empty({padded / 8}, worker_bits.options());
  group.all_to_all(worker_bits, received);
  at::Tensor all_worker_scales = at::empty({p * B}, f32);
  group.all_gather(worker_scales, all_worker_scales);

  // Server: average my chunk over the ranks, compensate with my server error, compress again.
  const int64_t lo = me * chunk;
  at::Tensor c = at::zeros({chunk}, f32), decoded = at::empty({chunk}, f32);
  for (int j = 0; j < p; ++j) {
    unpack(received.narrow(0, j * chunk / 8, chunk / 8), decoded);
    apply_scales(decoded, lo, blocks, all_worker_scales.narrow(0, j * B, B));
    c.add_(decoded);
  }
  c.mul_(1.0 / p).add_(errors.server);
  at::Tensor server_scales;
  const at::Tensor server_bits = compress(c, lo, blocks, server_scales, errors.server);

  // Everyone gets every server's chunk, decoded straight into x's padded copy.
  at::Tensor all_bits = at::empty({padded / 8}, server_bits.options());
  group.all_gather(server_bits, all_bits);
  at::Tensor all_server_scales = at::empty({p * B}, f32);
  group.all_gather(server_scales, all_server_scales);
  at::Tensor result = at::empty({padded}, f32);
  for (int j = 0; j < p; ++j) {
    at::Tensor part = result.narrow(0, j * chunk, chunk);
    unpack(all_bits.narrow(0, j * chunk / 8, chunk / 8), part);
    apply_scales(part, j * chunk, blocks, all_server_scales.narrow(0, j * B, B));
  }
  x.reshape({-1}).copy_(result.narrow(0, 0, n));
}

}  // namespace tessera
