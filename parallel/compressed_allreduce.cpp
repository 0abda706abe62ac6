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

// Two implementations of the same steps: fused loops over the buffers for CPU tensors (below,
// "CPU"), and ATen operations in the same wire format for other devices (a GPU), which
// TESSERA_COMPRESSION_ATEN=1 also selects on the CPU (the tests run both).
bool use_aten(const at::Tensor& t) {
  static const bool forced = [] {
    const char* v = std::getenv("TESSERA_COMPRESSION_ATEN");
    return v && *v && std::string(v) != "0";
  }();
  return !t.is_cpu() || forced;
}

// ---- ATen

// The signs of t (numel a multiple of 8), 8 to a byte: bit i of byte k is t[8k + i] >= 0.
at::Tensor pack_aten(const at::Tensor& t) {
  const at::Tensor weights = at::arange(8, t.options().dtype(at::kLong)).exp2().to(at::kByte);  // 1, 2, ..., 128
  return t.ge(0).view({-1, 8}).to(at::kByte).mul(weights).sum(1, /*keepdim=*/false, at::kByte);
}

// out[i] = +1 or -1 by bit i of `bits` (out.numel() a multiple of 8).
void unpack_aten(const at::Tensor& bits, at::Tensor& out) {
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
  at::Tensor bits = pack_aten(t);
  scales = block_scales(t, lo, blocks);
  unpack_aten(bits, error);
  apply_scales(error, lo, blocks, scales);
  error.neg_().add_(t);
  return bits;
}

// The worker: b = x + e_w compressed; e_w ← what was lost. Returns the signs, `scales` one per block.
at::Tensor worker_aten(const at::Tensor& x, at::Tensor& error, const Blocks& blocks, at::Tensor& scales) {
  at::Tensor b = error.clone();
  b.narrow(0, 0, x.numel()).add_(x);
  return compress(b, 0, blocks, scales, error);
}

// The server of chunk [lo, lo + chunk): c = (1/p)·Σ_j decoded_j + e_s compressed; e_s ← what was lost.
at::Tensor server_aten(const at::Tensor& received, const at::Tensor& worker_scales, int64_t lo, int64_t chunk,
                       const Blocks& blocks, int p, at::Tensor& error, at::Tensor& scales) {
  const int B = blocks.count();
  at::Tensor c = at::zeros({chunk}, error.options()), decoded = at::empty({chunk}, error.options());
  for (int j = 0; j < p; ++j) {
    unpack_aten(received.narrow(0, j * chunk / 8, chunk / 8), decoded);
    apply_scales(decoded, lo, blocks, worker_scales.narrow(0, j * B, B));
    c.add_(decoded);
  }
  c.mul_(1.0 / p).add_(error);
  return compress(c, lo, blocks, scales, error);
}

// out (the first out.numel() elements of chunk [lo, lo + chunk)) ← the chunk decoded.
void decode_aten(const at::Tensor& bits, int64_t lo, int64_t chunk, const Blocks& blocks, const at::Tensor& scales,
                 at::Tensor out) {
  at::Tensor whole = at::empty({chunk}, out.options());
  unpack_aten(bits, whole);
  apply_scales(whole, lo, blocks, scales);
  out.copy_(whole.narrow(0, 0, out.numel()));
}

// ---- CPU: the same steps in fused loops over the buffers (3 passes for a worker instead of ATen's
// 8); equal to the ATen steps but for the scales' rounding (their sums of squares in double).

float block_scale(double sum_of_squares, int64_t len) {
  return static_cast<float>(std::sqrt(sum_of_squares) / std::sqrt(static_cast<double>(len)));
}

// out[i] = ±scales[block of lo + i] for i < n, by bit i of `bits` (relative to lo): the SIMD
// unpacking with each block's scale, the few elements before a block's first whole byte one by one.
void decode_cpu(const uint8_t* bits, int64_t lo, int64_t n, const Blocks& blocks, const float* scales, float* out) {
  auto one = [&](int64_t i, float s) { out[i] = ((bits[i >> 3] >> (i & 7)) & 1) ? s : -s; };
  blocks.for_each_piece(lo, lo + n, [&](int b, int64_t begin, int64_t end) {
    const float s = scales[b];
    int64_t i = begin - lo;
    const int64_t stop = end - lo;
    for (; i < stop && (i & 7) != 0; ++i) one(i, s);
    const int64_t whole = (stop - i) / 8 * 8;
    if (whole > 0) unpack_signs(bits + i / 8, whole, s, out + i);
    for (i += whole; i < stop; ++i) one(i, s);
  });
}

// After the signs are packed: e ← e − ±scale (e holds b, whose own sign decides), per block piece.
void subtract_decoded(float* e, int64_t lo, int64_t n, const Blocks& blocks, const float* scales) {
  blocks.for_each_piece(lo, lo + n, [&](int b, int64_t begin, int64_t end) {
    const float s = scales[b];
    for (int64_t i = begin - lo; i < end - lo; ++i) e[i] -= e[i] >= 0 ? s : -s;
  });
}

at::Tensor worker_cpu(const at::Tensor& x, at::Tensor& error, const Blocks& blocks, at::Tensor& scales) {
  const int64_t n = x.numel(), padded = error.numel();
  const float* xs = x.data_ptr<float>();
  float* e = error.data_ptr<float>();
  scales = at::zeros({blocks.count()}, error.options());
  float* sc = scales.data_ptr<float>();
  // b = x + e (the padding: e alone) into e, and each block's sum of squares.
  blocks.for_each_piece(0, padded, [&](int b, int64_t begin, int64_t end) {
    double sum = 0;
    const int64_t mid = std::min(end, std::max(begin, n));
    for (int64_t i = begin; i < mid; ++i) {
      const float v = e[i] + xs[i];
      e[i] = v;
      sum += double(v) * v;
    }
    for (int64_t i = mid; i < end; ++i) sum += double(e[i]) * e[i];
    sc[b] = block_scale(sum, end - begin);
  });
  at::Tensor bits = at::empty({padded / 8}, error.options().dtype(at::kByte));
  pack_signs(e, padded, bits.data_ptr<uint8_t>());
  subtract_decoded(e, 0, padded, blocks, sc);
  return bits;
}

at::Tensor server_cpu(const at::Tensor& received, const at::Tensor& worker_scales, int64_t lo, int64_t chunk,
                      const Blocks& blocks, int p, at::Tensor& error, at::Tensor& scales) {
  const int B = blocks.count();
  // Σ_j decoded_j: the first decoded in place, the others through one buffer.
  at::Tensor sum = at::empty({chunk}, error.options()), decoded;
  float* cs = sum.data_ptr<float>();
  const uint8_t* bits = received.data_ptr<uint8_t>();
  decode_cpu(bits, lo, chunk, blocks, worker_scales.data_ptr<float>(), cs);
  if (p > 1) decoded = at::empty({chunk}, error.options());
  for (int j = 1; j < p; ++j) {
    float* d = decoded.data_ptr<float>();
    decode_cpu(bits + j * chunk / 8, lo, chunk, blocks, worker_scales.data_ptr<float>() + j * B, d);
    for (int64_t i = 0; i < chunk; ++i) cs[i] += d[i];
  }
  // c = sum / p + e_s, into the error buffer, and each block piece's sum of squares; then the
  // buffer keeps c − decoded(c).
  const float inverse = static_cast<float>(1.0 / p);
  float* e = error.data_ptr<float>();
  scales = at::zeros({B}, error.options());
  float* sc = scales.data_ptr<float>();
  blocks.for_each_piece(lo, lo + chunk, [&](int b, int64_t begin, int64_t end) {
    double squares = 0;
    for (int64_t i = begin - lo; i < end - lo; ++i) {
      float v = cs[i] * inverse;
      v = v + e[i];
      e[i] = v;
      squares += double(v) * v;
    }
    sc[b] = block_scale(squares, end - begin);
  });
  at::Tensor packed = at::empty({chunk / 8}, error.options().dtype(at::kByte));
  pack_signs(e, chunk, packed.data_ptr<uint8_t>());
  subtract_decoded(e, lo, chunk, blocks, sc);
  return packed;
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

  const bool cpu = !use_aten(x);
  at::Tensor flat = x.view({-1});

  // Worker: compensate, compress, keep what was lost.
  at::Tensor worker_scales;
  const at::Tensor worker_bits = cpu ? worker_cpu(flat, errors.worker, blocks, worker_scales)
                                     : worker_aten(flat, errors.worker, blocks, worker_scales);

  // Chunk j of the signs to rank j; every rank's scales to everyone.
  at::Tensor received = at::empty({padded / 8}, worker_bits.options());
  group.all_to_all(worker_bits, received);
  at::Tensor all_worker_scales = at::empty({p * B}, f32);
  group.all_gather(worker_scales, all_worker_scales);

  // Server: average my chunk over the ranks, compensate with my server error, compress again.
  const int64_t lo = me * chunk;
  at::Tensor server_scales;
  const at::Tensor server_bits =
      cpu ? server_cpu(received, all_worker_scales, lo, chunk, blocks, p, errors.server, server_scales)
          : server_aten(received, all_worker_scales, lo, chunk, blocks, p, errors.server, server_scales);

  // Everyone gets every server's chunk, decoded straight into x.
  at::Tensor all_bits = at::empty({padded / 8}, server_bits.options());
  group.all_gather(server_bits, all_bits);
  at::Tensor all_server_scales = at::empty({p * B}, f32);
  group.all_gather(server_scales, all_server_scales);
  for (int j = 0; j < p; ++j) {
    const int64_t valid = std::min(chunk, n - j * chunk);  // the last chunks hold the padding
    if (valid <= 0) break;
    if (cpu)
      decode_cpu(all_bits.data_ptr<uint8_t>() + j * chunk / 8, j * chunk, valid, blocks,
                 all_server_scales.data_ptr<float>() + j * B, flat.data_ptr<float>() + j * chunk);
    else
      decode_aten(all_bits.narrow(0, j * chunk / 8, chunk / 8), j * chunk, chunk, blocks,
                  all_server_scales.narrow(0, j * B, B), flat.narrow(0, j * chunk, valid));
  }
}

}  // namespace tessera
