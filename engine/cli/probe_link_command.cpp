// `tessera probe-link`: the links between hosts as the planner needs them (docs/planner.md,
// "Calibration"). Run under the launcher with a rank on each host:
//
//   tessera launch --hostfile HOSTS --nproc-per-node 1 -- tessera probe-link
//
// every rank times Gloo's reduce-scatter + all-gather of 32 MiB, its allreduce and a one-element
// allreduce's latency over the whole job (engine/planner/probe.h time_link, what `tessera plan
// --measure` times among a node's ranks on loopback), and rank 0 prints the slowest rank's figures
// and writes them to the calibration cache, where `tessera plan` (and "auto" in a config) takes the
// bus bandwidth as the rate between nodes unless --inter-node-bw gives one.
//
// Exit status: 0 measured, 1 the cache could not be written, 2 not launched across hosts.
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstdio>
#include <vector>
#include <iostream>
#include <string>

#include "engine/cli/commands.h"
#include "engine/planner/calibration.h"
#include "engine/planner/probe.h"
#include "parallel/communicator.h"
#include "parallel/parallel_context.h"

namespace tessera {

namespace {

struct ProbeLinkFlags {
  int mib = 32;
  std::string cache;
};

int run_probe_link(const ProbeLinkFlags& f) {
  const RendezvousInfo info = rendezvous_info_from_environment();
  if (info.world_size < 2) {
    std::cerr << "tessera probe-link: needs ranks on two hosts or more, started by the launcher: tessera launch "
                 "--hostfile HOSTS --nproc-per-node 1 -- tessera probe-link (found "
              << info.world_size << " rank, " << info.source << ")\n";
    return 2;
  }
  const int hosts = info.world_size / std::max(1, info.local_world_size);
  if (hosts < 2) {
    std::cerr << "tessera probe-link: all " << info.world_size << " ranks are on one host (LOCAL_WORLD_SIZE "
              << info.local_world_size << "): that is the link inside a node, which tessera plan --measure times; "
              << "start a rank on each of two hosts or more (tessera launch --hostfile HOSTS --nproc-per-node 1)\n";
    return 2;
  }
  ParallelOptions options;
  options.backend = "gloo", options.device = "cpu";
  auto context = ParallelContext::from_environment(options);
  Communicator& world = context->world();
  const planner::LinkProbe mine = planner::time_link(world, int64_t(f.mib) << 20);
  // Every rank's figures to every rank; the job is as fast as its slowest rank.
  const int n = world.size();
  at::Tensor part = at::tensor({float(mine.bus_gbps), float(mine.latency_us), float(mine.reduce_scatter_gbps),
                                float(mine.all_gather_gbps), float(mine.all_reduce_gbps)});
  at::Tensor all = at::empty({5 * n});
  world.all_gather(part, all);
  if (world.rank() != 0) return 0;
  std::vector<planner::LinkProbe> per_rank;
  for (int r = 0; r < n; ++r) {
    const float* v = all.data_ptr<float>() + 5 * r;
    per_rank.push_back({v[0], v[1], v[2], v[3], v[4], {}});
  }
  const planner::LinkProbe slowest = planner::slowest_of(per_rank);
  const std::string across = "of " + std::to_string(f.mib) + " MiB across " + std::to_string(n) + " ranks (" +
                             std::to_string(info.local_world_size) + " a host)";
  char line[256];
  std::snprintf(line, sizeof line,
                "tessera probe-link: %d ranks on %d hosts: reduce-scatter + all-gather %.3f GB/s bus bandwidth "
                "(reduce-scatter %.3f, all-gather %.3f, allreduce %.3f), latency %.0f us",
                n, hosts, slowest.bus_gbps, slowest.reduce_scatter_gbps, slowest.all_gather_gbps,
                slowest.all_reduce_gbps, slowest.latency_us);
  std::cout << line << std::endl;
  const std::string cache = f.cache.empty() ? planner::default_calibration_cache() : f.cache;
  if (!planner::save_inter_node_probe(cache, slowest, across)) {
    std::cerr << "tessera probe-link: could not write " << cache << "\n";
    return 1;
  }
  std::cout << "tessera probe-link: written to " << cache << " (tessera plan takes it as the rate between nodes)"
            << std::endl;
  return 0;
}

}  // namespace

void register_probe_link_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ProbeLinkFlags>();
  CLI::App* sub = app.add_subcommand(
      "probe-link", "Time Gloo's collectives between hosts for the planner (run under tessera launch, a rank a host)");
  sub->add_option("--mib", f->mib, "The buffer each collective moves, MiB (32)")->check(CLI::PositiveNumber);
  sub->add_option("--cache", f->cache, "The calibration cache to write (~/.cache/tessera/calibration.json)");
  sub->callback([f, &exit_code] { exit_code = run_probe_link(*f); });
}

}  // namespace tessera
