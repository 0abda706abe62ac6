// Collectives on 2 and 4 real processes over Gloo, started through `tessera launch`, checked
// against values computed by hand (tests/workers/worker.cpp), including uneven lengths.
#include <catch2/catch.hpp>

#include <map>

#include "csrc/sign_pack.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <limits>
#include <type_traits>

#include "parallel/c10d_compat.h"
#include "parallel/communicator.h"
#include "tests/subprocess.h"

using tessera::testing::contains;

namespace {
tessera::testing::RunResult launch(int ranks, std::vector<std::string> worker_args, int port,
                                   const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {TESSERA_CLI_PATH, "launch", "--nproc-per-node", std::to_string(ranks),
                                   "--master-port", std::to_string(port), "--timeout", "60", "--",
                                   TESSERA_WORKER_PATH};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return tessera::testing::run(argv, env, 120);
}
}  // namespace

TEST_CASE("collectives on 2 ranks with the backend's native reduce-scatter and allgather") {
  auto r = launch(2, {"collectives", "--native-reduce-scatter"}, tessera::testing::free_port());
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "collectives ok on rank 0"));
  CHECK(contains(r.output, "collectives ok on rank 1"));
  CHECK(!contains(r.output, "native reduce-scatters 0,"));
}

TEST_CASE("collectives on 4 ranks with tensor-parallel groups of 2") {
  auto r = launch(4, {"collectives", "--tp", "2"}, tessera::testing::free_port());
  INFO(r.output);
  CHECK(r.status == 0);
  // Gloo's defaults: reduce-scatters of every size and allgathers run as sends and receives.
  CHECK(!contains(r.output, "pairwise 0)"));
  CHECK(contains(r.output, "native reduce-scatters 0,"));
  CHECK(contains(r.output, "all-to-all 0,"));
  for (int rank = 0; rank < 4; ++rank) CHECK(contains(r.output, "collectives ok on rank " + std::to_string(rank)));
}

// optim/grad_norm.h on 2 × 2 grids: parts flagged data-/tensor-sharded and replicated, each piece
// counted once, against the closed form the worker computes over the grid; an inf on one rank
// reaches every rank.
TEST_CASE("the gradient norm reduces over the right groups on 2 x 2 grids") {
  for (std::vector<std::string> grid : {std::vector<std::string>{"--tp", "2"}, {"--tp", "2", "--pp", "2"}}) {
    std::vector<std::string> args = {"grad-norm"};
    args.insert(args.end(), grid.begin(), grid.end());
    auto r = launch(4, args, tessera::testing::free_port());
    INFO(r.output);
    CHECK(r.status == 0);
    for (int rank = 0; rank < 4; ++rank) CHECK(contains(r.output, "grad norm ok on rank " + std::to_string(rank)));
  }
}

TEST_CASE("reduce-scatter built from all-to-all gives the same results (2 and 4 ranks)") {
  for (int ranks : {2, 4}) {
    auto r = launch(ranks, {"collectives", "--alltoall-reduce-scatter"}, tessera::testing::free_port());
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "(native reduce-scatters 0, all-to-all"));
    CHECK(contains(r.output, "pairwise 0)"));
    CHECK(!contains(r.output, "all-to-all 0,"));
  }
}

TEST_CASE("a dead peer makes the others fail with the collective and the group named") {
  // Started directly (not through the launcher, which would stop the survivors itself).
  std::vector<tessera::testing::Started> ranks;
  const std::string port = std::to_string(tessera::testing::free_port());
  for (int r = 0; r < 2; ++r)
    ranks.push_back(tessera::testing::start({TESSERA_WORKER_PATH, "dead-peer"},
                                            {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                                             {"MASTER_PORT", port}, {"TESSERA_TIMEOUT_S", "20"}}));
  auto survivor = tessera::testing::finish(ranks[0], 60);
  auto dead = tessera::testing::finish(ranks[1], 60);
  INFO(survivor.output);
  CHECK(dead.status == 3);
  CHECK(survivor.status == 1);
  CHECK(survivor.seconds < 30);
  CHECK(contains(survivor.output, "all_reduce of 1000 float elements on group 'world'"));
}

// ---- what a Communicator accepts (one process, a one-rank Gloo group) ----------------------

namespace {
c10::intrusive_ptr<c10d::Backend> one_rank_gloo() {
  return tessera::make_backend(tessera::BackendKind::Gloo, c10::make_intrusive<c10d::HashStore>(), 0, 1,
                               std::chrono::milliseconds(10000));
}
}  // namespace

TEST_CASE("every collective takes its tensors on the group's device and names a mismatch") {
  using tessera::Communicator;
  // A group declared on another device than the tensors it is given refuses them before any
  // backend call; the engine builds its scalars with the group's options(), so on NCCL they are CUDA.
  Communicator cpu(one_rank_gloo(), "data", {0}, 0, c10::Device(c10::kCPU), true);
  at::Tensor t = at::ones({4}, cpu.options());
  CHECK(t.device() == c10::Device(c10::kCPU));
  cpu.all_reduce(t);
  CHECK(t.sum().item<float>() == 4);

  Communicator meta(one_rank_gloo(), "data", {0}, 0, c10::Device(c10::kMeta), true);
  CHECK(meta.options(at::kDouble).device() == c10::Device(c10::kMeta));
  at::Tensor x = at::ones({4});
  at::Tensor out = at::ones({4});
  const auto wrong_device = Catch::Contains("got a tensor on cpu; this group's collectives take tensors on meta");
  CHECK_THROWS_WITH(meta.all_reduce(x), wrong_device);
  CHECK_THROWS_WITH(meta.broadcast(x, 0), wrong_device);
  CHECK_THROWS_WITH(meta.all_gather(x, out), wrong_device);
  CHECK_THROWS_WITH(meta.reduce_scatter(x, out), wrong_device);
  CHECK_THROWS_WITH(meta.all_to_all(x, out), wrong_device);
}

// A handle's completion mutates the result (an Avg divides it): a copy could run it twice.
static_assert(!std::is_copy_constructible_v<tessera::CommHandle>, "CommHandle must be move-only");
static_assert(std::is_nothrow_move_constructible_v<tessera::CommHandle>, "CommHandle moves");

TEST_CASE("a communicator counts calls and bytes and seconds per collective") {
  tessera::Communicator comm(one_rank_gloo(), "data", {0}, 0, c10::Device(c10::kCPU), true);
  at::Tensor t = at::ones({256}, comm.options());
  comm.all_reduce(t);
  tessera::CommHandle pending = comm.all_reduce_async(t, tessera::ReduceOp::Avg);
  pending.wait();
  at::Tensor whole = at::zeros({256}, comm.options());
  comm.all_gather(t, whole);
  comm.barrier();
  const auto& stats = comm.stats();
  REQUIRE(stats.count("all_reduce") == 1);
  CHECK(stats.at("all_reduce").calls == 2);
  CHECK(stats.at("all_reduce").bytes == 2 * 256 * 4);
  CHECK(stats.at("all_reduce").seconds > 0);
  CHECK(stats.at("all_gather").calls == 1);
  CHECK(stats.at("all_gather").bytes == 256 * 4);
  CHECK(stats.at("barrier").calls == 1);
  CHECK(stats.count("reduce_scatter") == 0);
  comm.reset_stats();
  CHECK(comm.stats().at("all_reduce").calls == 0);
  CHECK(comm.stats().at("all_reduce").bytes == 0);
}

// Pipeline parallelism (parallel/pipeline/executor.h): an MLP cut into 2 and 4 stages, trained by
// 1F1B and GPipe with SGD, equals the same MLP trained in one process (losses and every stage's
// parameters, checked on each rank); the activations each stage held equal the simulator's.
TEST_CASE("pipeline executor: 1f1b and gpipe on 2 and 4 stages train as one process does") {
  struct Run { int stages, micro; std::string schedule; bool dynamic; };
  for (const Run& r : {Run{2, 4, "1f1b", false}, Run{2, 4, "gpipe", false}, Run{4, 6, "1f1b", false}, Run{4, 3, "1f1b", true},
                       Run{4, 5, "gpipe", false}}) {
    std::vector<std::string> args{"pipeline", "--pp", std::to_string(r.stages), "--schedule", r.schedule, "--micro",
                                  std::to_string(r.micro)};
    if (r.dynamic) args.push_back("--dynamic-shape");
    auto out = launch(r.stages, args, tessera::testing::free_port());
    INFO(out.output);
    REQUIRE(out.status == 0);
    for (int rank = 0; rank < r.stages; ++rank) CHECK(contains(out.output, "pipeline ok on rank " + std::to_string(rank)));
  }
}

// Two chunks a stage. Interleaved 1F1B: the MLP's 8 layers in stages × 2 chunks, stage s holding
// chunks s and s + p; the last stage's first chunk sends to the first stage's second (the
// wrap-around), on the activation stream beside the gradients going the same way. ZB-V: the chunks
// in a V (stage s holding s and 2p − 1 − s): the last stage hands its first chunk's output to its
// second in-process, stage 0 computes the loss, and every backward is split into B and W.
TEST_CASE("pipeline executor: interleaved 1f1b and zb_v with 2 chunks on 2 and 4 stages train as one process does") {
  struct Run { const char* schedule; int stages, micro; };
  for (const Run& r : {Run{"interleaved_1f1b", 2, 4}, Run{"interleaved_1f1b", 2, 6}, Run{"interleaved_1f1b", 4, 8},
                       Run{"zb_v", 2, 4}, Run{"zb_v", 2, 3}, Run{"zb_v", 4, 8}, Run{"zb_v", 4, 2}}) {
    auto out = launch(r.stages, {"pipeline", "--pp", std::to_string(r.stages), "--schedule", r.schedule, "--micro",
                                 std::to_string(r.micro), "--chunks", "2"},
                      tessera::testing::free_port());
    INFO(out.output);
    REQUIRE(out.status == 0);
    for (int rank = 0; rank < r.stages; ++rank) CHECK(contains(out.output, "pipeline ok on rank " + std::to_string(rank)));
  }
}

TEST_CASE("pipeline executor: a loss computed on a non-final stage is named") {
  auto out = launch(2, {"pipeline", "--pp", "2", "--loss-on-first-stage"}, tessera::testing::free_port());
  INFO(out.output);
  CHECK(out.status != 0);
  CHECK(contains(out.output, "stage 0 of 2 returned a scalar from its forward"));
  CHECK(contains(out.output, "only the last stage computes the loss"));
}

// The 1-bit compressed allreduce (parallel/compressed_allreduce.h) against a plain simulation of
// the algorithm, 3 calls (the error buffers carry over), lengths that do not divide, 2 and 4 ranks.
// Each sign-packing kernel the CPU has, forced in turn by TESSERA_SIGN_PACK_ISA, and the ATen
// packing (TESSERA_COMPRESSION_ATEN).
TEST_CASE("compressed allreduce: results and error buffers equal the plain algorithm on 2 and 4 ranks") {
  for (int ranks : {2, 4}) {
    auto out = launch(ranks, {"compressed-allreduce"}, tessera::testing::free_port());
    INFO(out.output);
    REQUIRE(out.status == 0);
    for (int rank = 0; rank < ranks; ++rank)
      CHECK(contains(out.output, "compressed allreduce ok on rank " + std::to_string(rank) + ": n 4101, 6 blocks"));
  }
  for (tessera::Isa isa : {tessera::Isa::Scalar, tessera::Isa::Avx2, tessera::Isa::Avx512}) {
    if (!tessera::cpu_supports(isa)) {
      WARN("compressed allreduce: this CPU has no " << tessera::isa_name(isa) << "; not forced");
      continue;
    }
    auto out = launch(2, {"compressed-allreduce"}, tessera::testing::free_port(),
                      {{"TESSERA_SIGN_PACK_ISA", tessera::isa_name(isa)}});
    INFO(tessera::isa_name(isa) << "\n" << out.output);
    REQUIRE(out.status == 0);
    CHECK(contains(out.output, "compressed allreduce ok on rank 1: n 4101, 6 blocks"));
  }
  // The ATen packing a GPU uses, in the same wire format, forced on the CPU.
  auto aten = launch(4, {"compressed-allreduce"}, tessera::testing::free_port(), {{"TESSERA_COMPRESSION_ATEN", "1"}});
  INFO(aten.output);
  REQUIRE(aten.status == 0);
  CHECK(contains(aten.output, "compressed allreduce ok on rank 3: n 4101, 6 blocks"));
}

TEST_CASE("a one-rank group's reduce-scatter and all-gather give the input back in every form") {
  using tessera::Communicator;
  using tessera::CommunicatorOptions;
  for (int form = 0; form < 3; ++form) {  // native, all-to-all, pairwise sends and receives
    CommunicatorOptions o;
    o.alltoall_reduce_scatter_max_bytes = form == 0 ? 0 : std::numeric_limits<int64_t>::max();
    o.pairwise_reduce_scatter = form == 2 ? 1 : 0;
    o.pairwise_all_gather = form == 2 ? 1 : 0;
    Communicator one(one_rank_gloo(), "data", {0}, 0, c10::Device(c10::kCPU), true, o);
    INFO("form " << form);
    at::Tensor in = at::arange(6, at::kFloat), out = at::zeros({6});
    one.reduce_scatter(in, out);
    CHECK(at::equal(out, in));
    at::Tensor gathered = at::zeros({6});
    one.all_gather(in, gathered);
    CHECK(at::equal(gathered, in));
    CHECK(one.native_reduce_scatters() + one.alltoall_reduce_scatters() + one.pairwise_reduce_scatters() == 1);
    CHECK((form == 2 ? one.pairwise_reduce_scatters() : form == 1 ? one.alltoall_reduce_scatters()
                                                                 : one.native_reduce_scatters()) == 1);
  }
}
