// tessera_test_worker compressed-allreduce: parallel/compressed_allreduce.h on every rank against a
// plain implementation of the same algorithm that simulates all ranks in this process (each rank's
// input is a function of its rank), over 3 calls so the error buffers carry over, on lengths that
// do not divide by 8 · ranks. Prints "compressed allreduce ok on rank R" and the bytes sent.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/compressed_allreduce.h"
#include "parallel/parallel_context.h"
#include "tests/workers/worker_compressed.h"

using namespace tessera;

namespace {

at::Tensor input_of(int rank, int call, int64_t n) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1000 * call + rank + 7);
  return at::randn({n}, g, at::kFloat);
}

at::Tensor signs(const at::Tensor& t) { return at::where(t >= 0, 1.0f, -1.0f); }

// What the compression sends for elements [lo, lo + t.numel()): sign × the scale of each block
// piece (bounds: the block starts and the padded end), each scale ‖piece‖/√len.
at::Tensor compressed(const at::Tensor& t, int64_t lo, const std::vector<int64_t>& bounds) {
  at::Tensor out = signs(t);
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    const int64_t begin = std::max(lo, bounds[b]), end = std::min(lo + t.numel(), bounds[b + 1]);
    if (begin >= end) continue;
    at::Tensor piece = t.narrow(0, begin - lo, end - begin);
    out.narrow(0, begin - lo, end - begin).mul_(piece.norm().item<double>() / std::sqrt(double(end - begin)));
  }
  return out;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double diff = (got - want).abs().max().item<double>();
  if (diff > 1e-5) throw std::runtime_error("check failed: " + what + " differs by " + std::to_string(diff));
}

}  // namespace

void check_compressed_allreduce(ParallelContext& ctx) {
  Communicator& group = ctx.world();
  const int p = group.size(), me = group.rank();
  // (n, where the scale blocks start): one block, and blocks that cut the servers' chunks anywhere.
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      {1000, {}}, {13, {}}, {4101, {}}, {13, {0, 5}}, {4101, {0, 7, 1000, 2051, 2052, 4000}}};
  for (const auto& [n, starts] : cases) {
    const int64_t padded = compressed_padded_size(n, p), chunk = padded / p;
    std::vector<int64_t> bounds = starts.empty() ? std::vector<int64_t>{0} : starts;
    bounds.push_back(padded);
    const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
    CompressionErrors mine = CompressionErrors::zeros(n, group);
    // The reference's buffers for every rank.
    std::vector<at::Tensor> worker_error(p, at::zeros({padded})), server_error(p, at::zeros({chunk}));
    group.reset_stats();
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = input_of(me, call, n);
      compressed_allreduce(x, mine, group, starts);
      // Reference: every worker, then every server, in plain tensor arithmetic.
      std::vector<at::Tensor> worker_sent(p);
      for (int r = 0; r < p; ++r) {
        at::Tensor b = worker_error[r].clone();
        b.narrow(0, 0, n).add_(input_of(r, call, n));
        worker_sent[r] = compressed(b, 0, bounds);
        worker_error[r] = b - worker_sent[r];
      }
      std::vector<at::Tensor> server_out(p);
      for (int s = 0; s < p; ++s) {
        at::Tensor c = at::zeros({chunk});
        for (int r = 0; r < p; ++r) c.add_(worker_sent[r].narrow(0, s * chunk, chunk));
        c.mul_(1.0 / p).add_(server_error[s]);
        server_out[s] = compressed(c, s * chunk, bounds);
        server_error[s] = c - server_out[s];
      }
      const at::Tensor expected = at::cat(server_out).narrow(0, 0, n);
      const std::string where = " (n " + std::to_string(n) + ", " + std::to_string(blocks) + " blocks, call " +
                                std::to_string(call) + ", rank " + std::to_string(me) + ")";
      expect_close(x, expected, "result" + where);
      expect_close(mine.worker, worker_error[me], "worker error" + where);
      expect_close(mine.server, server_error[me], "server error" + where);
    }
    int64_t bytes = 0, sent = 0;
    for (const auto& [name, stats] : group.stats())
      if (name != "barrier") bytes += stats.bytes, sent += stats.sent_bytes;
    // What this rank puts on the wire per call: (p−1)/p of the N/8 sign bytes twice, and its
    // blocks' scales to p−1 peers twice.
    const int64_t expected_sent = 2 * (p - 1) * (padded / 8) / p + 2 * (p - 1) * blocks * 4;
    if (sent != 3 * expected_sent)
      throw std::runtime_error("check failed: sent " + std::to_string(sent / 3) + " bytes per call, expected " +
                               std::to_string(expected_sent));
    std::printf("compressed allreduce ok on rank %d: n %lld, %lld blocks, %lld bytes into collectives and %lld sent "
                "per call (fp32 ring allreduce: %lld sent)\n",
                me, (long long)n, (long long)blocks, (long long)(bytes / 3), (long long)(sent / 3),
                (long long)(2 * (p - 1) * 4 * n / p));
  }
}
