// The program each rank runs in the multi-rank tests (started by `tessera launch` or by a test).
//
//   tessera_test_worker collectives [--tp N]   every collective against values computed by hand
//   tessera_test_worker context                rendezvous, print the context, exit
//   tessera_test_worker pipeline --pp N [--schedule NAME] [--micro M] [--chunks V] [--dynamic-shape]
//                                              [--loss-on-first-stage]
//                                              an MLP through the pipeline executor against the
//                                              same MLP in one process (worker_pipeline.cpp)
//   tessera_test_worker compressed-allreduce  the 1-bit allreduce against a plain simulation of it
//                                              (worker_compressed.cpp)
//   tessera_test_worker tensor-parallel --tp T   the tensor-parallel regions and layers against the
//                                              whole computation (worker_tensor_parallel.cpp)
//   tessera_test_worker dead-peer              the last rank exits; the others call all_reduce
//   tessera_test_worker grad-norm [--tp N] [--pp N]   the global gradient norm (optim/grad_norm.h)
//                                              over parts flagged data-/tensor-sharded, against
//                                              the closed form
//
// Each check failure throws; the exit status is 1 with the message on stderr.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "csrc/process_exit.h"
#include "optim/grad_norm.h"
#include "parallel/parallel_context.h"
#include "tests/workers/worker_compressed.h"
#include "tests/workers/worker_pipeline.h"
#include "tests/workers/worker_tensor_parallel.h"

using namespace tessera;

namespace {

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!at::allclose(got, want)) {
    std::ostringstream s;
    s << what << "\n got  " << got.slice(0, 0, 8) << "\n want " << want.slice(0, 0, 8);
    throw std::runtime_error("check failed: " + s.str());
  }
}

// Rank r contributes x_r[i] = i + 1000·r (as floats): every reduction has a closed form.
at::Tensor contribution(int64_t n, int r) { return at::arange(n, at::kFloat) + 1000.0f * r; }

void check_group(Communicator& g, int64_t n) {
  const int p = g.size(), me = g.rank();
  const std::string where = " (" + g.name() + ", n=" + std::to_string(n) + ")";
  const double rank_sum = 1000.0 * p * (p - 1) / 2;
  at::Tensor base = at::arange(n, at::kFloat);

  at::Tensor x = contribution(n, me);
  g.all_reduce(x, ReduceOp::Sum);
  expect_equal(x, base * p + rank_sum, "all_reduce sum" + where);
  x = contribution(n, me);
  g.all_reduce(x, ReduceOp::Avg);
  expect_equal(x, base + rank_sum / p, "all_reduce avg" + where);
  x = contribution(n, me);
  g.all_reduce(x, ReduceOp::Max);
  expect_equal(x, base + 1000.0f * (p - 1), "all_reduce max" + where);

  ChunkRange mine = chunk_range(n, p, me);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    at::Tensor out = at::empty({mine.size()}, at::kFloat);
    g.reduce_scatter(contribution(n, me), out, op);
    at::Tensor slice = base.narrow(0, mine.begin, mine.size());
    at::Tensor want = op == ReduceOp::Sum ? slice * p + rank_sum
                      : op == ReduceOp::Avg ? slice + rank_sum / p
                                            : slice + 1000.0f * (p - 1);
    expect_equal(out, want, "reduce_scatter op " + std::to_string(int(op)) + where);
  }

  // In place: the output is the input's own chunk (what ZeRO's buffers use, no receive buffer).
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    at::Tensor x = contribution(n, me);
    at::Tensor own = x.narrow(0, mine.begin, mine.size());
    g.reduce_scatter(x, own, op);
    at::Tensor slice = base.narrow(0, mine.begin, mine.size());
    expect_equal(own, op == ReduceOp::Sum ? slice * p + rank_sum : slice + rank_sum / p,
                 "in-place reduce_scatter op " + std::to_string(int(op)) + where);
  }

  at::Tensor gathered = at::empty({n}, at::kFloat);
  g.all_gather(base.narrow(0, mine.begin, mine.size()).contiguous(), gathered);
  expect_equal(gathered, base, "all_gather" + where);
  at::Tensor in_place = at::zeros({n}, at::kFloat);
  in_place.narrow(0, mine.begin, mine.size()).copy_(base.narrow(0, mine.begin, mine.size()));
  g.all_gather(in_place.narrow(0, mine.begin, mine.size()), in_place);
  expect_equal(in_place, base, "in-place all_gather" + where);

  at::Tensor b = me == p - 1 ? base.clone() : at::zeros({n}, at::kFloat);
  g.broadcast(b, p - 1);
  expect_equal(b, base, "broadcast from the last rank" + where);
}

void check_collectives(ParallelContext& ctx) {
  Communicator& world = ctx.world();
  const int p = world.size(), me = world.rank();
  for (int64_t n : {1, 7, 8, 1000, 1001, 4096 * 3 + 5}) {
    if (n < p) continue;  // every rank needs a non-empty chunk for all_gather's input
    check_group(world, n);
  }
  check_group(ctx.data(), 1003);
  check_group(ctx.tensor(), 10);

  // all_to_all: chunk j of rank i holds 100·i + j; afterwards chunk i of rank j holds 100·i + j.
  const int64_t k = 3;
  at::Tensor send = at::empty({p * k}, at::kFloat), recv = at::empty({p * k}, at::kFloat);
  for (int j = 0; j < p; ++j) send.narrow(0, j * k, k).fill_(100.0f * me + j);
  world.all_to_all(send, recv);
  for (int i = 0; i < p; ++i)
    expect_equal(recv.narrow(0, i * k, k), at::full({k}, 100.0f * i + me, at::kFloat), "all_to_all");

  // send/recv around a ring, even ranks sending first so the pattern cannot deadlock.
  at::Tensor out = at::full({5}, float(me), at::kFloat), in = at::empty({5}, at::kFloat);
  int next = (me + 1) % p, prev = (me + p - 1) % p;
  if (p > 1) {
    auto s = world.send_async(out, next);
    world.recv(in, prev);
    s.wait();
    expect_equal(in, at::full({5}, float(prev), at::kFloat), "send/recv ring");
  }

  // Async: two collectives in flight at once, waited in order.
  at::Tensor a = contribution(100, me), c = contribution(33, me);
  auto ha = world.all_reduce_async(a);
  auto hc = world.all_reduce_async(c, ReduceOp::Max);
  ha.wait();
  hc.wait();
  expect_equal(a, at::arange(100, at::kFloat) * p + 1000.0 * p * (p - 1) / 2, "async all_reduce");
  expect_equal(c, at::arange(33, at::kFloat) + 1000.0f * (p - 1), "async all_reduce max");
  world.barrier();
}

// Four kinds of gradient part on every rank of a pipe × data × tensor grid, each filled with a
// value that depends only on the coordinates it is split over, so every copy of a replicated part
// agrees (as real gradients would) and the whole model's Σ g² is a sum over the grid:
//   A  data- and tensor-sharded  3 elements of 1 + d + 2t + 4s
//   B  data-sharded, replicated  2 elements of 5 + d + 4s       (the same on every tensor rank)
//   C  whole, tensor-sharded     4 elements of 7 + t + 4s       (the same on every data rank)
//   D  whole, replicated         1 element of 10 + 4s           (the same on data and tensor ranks)
// Counting each piece once: Σ_{s,d,t} 3·A² + Σ_{s,d} 2·B² + Σ_{s,t} 4·C² + Σ_s D².
void check_grad_norm(ParallelContext& ctx) {
  const GridShape& g = ctx.grid();
  const Coordinates me = ctx.coordinates();
  auto a = [](int s, int d, int t) { return 1.0 + d + 2 * t + 4 * s; };
  auto b = [](int s, int d) { return 5.0 + d + 4 * s; };
  auto c = [](int s, int t) { return 7.0 + t + 4 * s; };
  auto e = [](int s) { return 10.0 + 4 * s; };
  double want = 0;
  for (int s = 0; s < g.pipe; ++s) {
    want += e(s) * e(s);
    for (int d = 0; d < g.data; ++d) want += 2 * b(s, d) * b(s, d);
    for (int t = 0; t < g.tensor; ++t) want += 4 * c(s, t) * c(s, t);
    for (int d = 0; d < g.data; ++d)
      for (int t = 0; t < g.tensor; ++t) want += 3 * a(s, d, t) * a(s, d, t);
  }
  std::vector<GradPart> parts = {
      {at::full({3}, a(me.pipe, me.data, me.tensor), at::kFloat), true, true, {}},
      {at::full({2}, b(me.pipe, me.data), at::kFloat), true, false, {}},
      {at::full({4}, c(me.pipe, me.tensor), at::kFloat), false, true, {}},
      {at::full({1}, e(me.pipe), at::kFloat), false, false, {}},
  };
  const NormGroups groups{&ctx.data(), &ctx.tensor(), &ctx.pipe()};
  const double got = global_grad_sumsq(parts, groups);
  if (std::abs(got - want) > 1e-6 * want)  // each part's norm is taken in fp32
    throw std::runtime_error("grad norm: sum of squares " + std::to_string(got) + ", closed form " + std::to_string(want));
  // A norm taken earlier (ZeRO takes each bucket's as its reduction completes) is used as it is:
  // the gradients it came from may have been overwritten since.
  std::vector<GradPart> taken = parts;
  for (GradPart& part : taken) {
    part.norm = gradient_norm(part.grads);
    part.grads = at::full_like(part.grads, 1e6);
  }
  const double from_norms = global_grad_sumsq(taken, groups);
  if (std::abs(from_norms - want) > 1e-6 * want)
    throw std::runtime_error("grad norm from norms taken earlier: " + std::to_string(from_norms) + ", closed form " +
                             std::to_string(want));
  // An overflow in a sharded part on one rank is an overflow everywhere; so is one in a replicated
  // part on one pipeline stage (its copies agree within the stage: they were allreduced).
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<GradPart> sharded_inf = parts, stage_inf = parts;
  sharded_inf[0].grads = parts[0].grads.clone();
  if (ctx.rank() == ctx.world_size() - 1) sharded_inf[0].grads[0] = inf;
  if (std::isfinite(global_grad_sumsq(sharded_inf, groups)))
    throw std::runtime_error("grad norm: the last rank's inf did not reach rank " + std::to_string(ctx.rank()));
  stage_inf[3].grads = parts[3].grads.clone();
  if (me.pipe == g.pipe - 1) stage_inf[3].grads[0] = inf;
  if (std::isfinite(global_grad_sumsq(stage_inf, groups)))
    throw std::runtime_error("grad norm: the last stage's inf did not reach rank " + std::to_string(ctx.rank()));
  std::printf("grad norm ok on rank %d: %.1f (closed form %.1f) in %s\n", ctx.rank(), got, want, g.str().c_str());
}

int run(const std::string& mode, int tp, int pp, bool force_alltoall, bool native_only) {
  ParallelOptions options;
  options.tensor = tp;
  options.pipe = pp;
  options.backend = "gloo";
  if (force_alltoall) {
    options.communicator.alltoall_reduce_scatter_max_bytes = std::numeric_limits<int64_t>::max();
    options.communicator.pairwise_reduce_scatter = 0;
  }
  if (native_only) {  // the backend's own reduce-scatter and allgather
    options.communicator.alltoall_reduce_scatter_max_bytes = 0;
    options.communicator.pairwise_all_gather = 0;
    options.communicator.pairwise_reduce_scatter = 0;
  }
  auto ctx = ParallelContext::from_environment(options);
  if (mode == "context") {
    std::printf("%s\n", ctx->describe().c_str());
    ctx->world().barrier();
    return 0;
  }
  if (mode == "collectives") {
    check_collectives(*ctx);
    std::printf("collectives ok on rank %d (native reduce-scatters %lld, all-to-all %lld, pairwise %lld)\n",
                ctx->rank(), (long long)ctx->world().native_reduce_scatters(),
                (long long)ctx->world().alltoall_reduce_scatters(), (long long)ctx->world().pairwise_reduce_scatters());
    return 0;
  }
  if (mode == "grad-norm") {
    check_grad_norm(*ctx);
    return 0;
  }
  if (mode == "compressed-allreduce") {
    check_compressed_allreduce(*ctx);
    return 0;
  }
  if (mode == "tensor-parallel") {
    check_tensor_parallel(*ctx);
    return 0;
  }
  if (mode == "dead-peer") {
    at::Tensor x = at::ones({1000}, at::kFloat);
    ctx->world().all_reduce(x);  // everyone alive here
    if (ctx->rank() == ctx->world_size() - 1) {
      std::fflush(stdout);
      _exit(3);  // dies without a word, as a crashed rank would
    }
    ctx->world().all_reduce(x);
    std::printf("unexpected: all_reduce succeeded without the last rank\n");
    return 0;
  }
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace

static int main_body(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "collectives";
  int tp = 1, pp = 1, micro = 4, chunks = 1;
  bool force_alltoall = false, native_only = false, dynamic_shape = false, loss_on_first_stage = false;
  std::string schedule = "1f1b";
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tp") && i + 1 < argc) tp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--pp") && i + 1 < argc) pp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--alltoall-reduce-scatter")) force_alltoall = true;
    else if (!std::strcmp(argv[i], "--native-reduce-scatter")) native_only = true;
    else if (!std::strcmp(argv[i], "--schedule") && i + 1 < argc) schedule = argv[++i];
    else if (!std::strcmp(argv[i], "--micro") && i + 1 < argc) micro = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--chunks") && i + 1 < argc) chunks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dynamic-shape")) dynamic_shape = true;
    else if (!std::strcmp(argv[i], "--loss-on-first-stage")) loss_on_first_stage = true;
  }
  try {
    if (mode == "pipeline") {
      ParallelOptions options;
      options.pipe = pp;
      options.backend = "gloo";
      auto ctx = ParallelContext::from_environment(options);
      check_pipeline(*ctx, schedule, micro, dynamic_shape, loss_on_first_stage, chunks);
      return 0;
    }
    return run(mode, tp, pp, force_alltoall, native_only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker error: %s\n", e.what());
    return 1;
  }
}

// Exits without LibTorch's static destructors (csrc/process_exit.h): main_body's objects are gone by then.
int main(int argc, char** argv) { tessera::exit_skipping_static_destructors(main_body(argc, argv)); }
