// tessera_test_worker compressed-allreduce: parallel/compressed_allreduce.h on every rank against a
// plain implementation of the same algorithm that simulates all ranks in this process (each rank's
// input is a function of its rank), over 3 calls so the error buffers carry over, on lengths that
// do not divide by 8 · ranks. Prints "compressed allreduce ok on rank R" and the bytes sent.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/compressed_allreduce.h"
#include "parallel/parallel_context.h"
#include "test_worker_compressed.h"

using namespace tessera;

namespace {

at::Tensor input_of(int rank, int call, int64_t n) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1000 * call + rank + 7);
  return at::randn({n}, g, at::kFloat);
}

at::Tensor signs(const at::Tensor& t) { return at::where(t >= 0, 1.0f, -1.0f); }
float scale_of(const at::Tensor& t) { return static_cast<float>(t.norm().item<double>() / std::sqrt(double(t.numel()))); }

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double diff = (got - want).abs().max().item<double>();
  if (diff > 1e-5) throw std::runtime_error("check failed: " + what + " differs by " + std::to_string(diff));
}

}  // namespace

void check_compressed_allreduce(ParallelContext& ctx) {
  Communicator& group = ctx.world();
  const int p = group.size(), me = group.rank();
  for (int64_t n : {int64_t{1000}, int64_t{13}, int64_t{4101}}) {
    const int64_t padded = compressed_padded_size(n, p), chunk = padded / p;
    CompressionErrors mine = CompressionErrors::zeros(n, group);
    // The reference's buffers for every rank.
    std::vector<at::Tensor> worker_error(p, at::zeros({padded})), server_error(p, at::zeros({chunk}));
    group.reset_stats();
    for (int call = 0; call < 3; ++call) {
      at::Tensor x = input_of(me, call, n);
      compressed_allreduce(x, mine, group);
      // Reference: every worker, then every server, in plain tensor arithmetic.
      std::vector<at::Tensor> worker_sent(p);
      std::vector<float> worker_scale(p);
      for (int r = 0; r < p; ++r) {
        at::Tensor b = worker_error[r].clone();
        b.narrow(0, 0, n).add_(input_of(r, call, n));
        worker_scale[r] = scale_of(b);
        worker_sent[r] = signs(b) * worker_scale[r];
        worker_error[r] = b - worker_sent[r];
      }
      std::vector<at::Tensor> server_out(p);
      for (int s = 0; s < p; ++s) {
        at::Tensor c = at::zeros({chunk});
        for (int r = 0; r < p; ++r) c.add_(worker_sent[r].narrow(0, s * chunk, chunk));
        c.mul_(1.0 / p).add_(server_error[s]);
        server_out[s] = signs(c) * scale_of(c);
        server_error[s] = c - server_out[s];
      }
      const at::Tensor expected = at::cat(server_out).narrow(0, 0, n);
      const std::string where = " (n " + std::to_string(n) + ", call " + std::to_string(call) + ", rank " + std::to_string(me) + ")";
      expect_close(x, expected, "result" + where);
      expect_close(mine.worker, worker_error[me], "worker error" + where);
      expect_close(mine.server, server_error[me], "server error" + where);
    }
    int64_t sent = 0;
    for (const auto& [name, stats] : group.stats())
      if (name != "barrier") sent += stats.bytes;
    std::printf("compressed allreduce ok on rank %d: n %lld, %lld bytes into collectives per call (fp32 allreduce: %lld)\n",
                me, (long long)n, (long long)(sent / 3), (long long)(4 * n));
  }
}
