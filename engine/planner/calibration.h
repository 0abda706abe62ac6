// The rates the planner's step-cost model runs on, and where each came from: given (a flag or a
// request key), measured now by a short probe on this machine (engine/planner/probe.h), cached
// from an earlier probe of this CPU (~/.cache/tessera/calibration.json), or the estimator's
// default for the device.
//
// The probe is for CPU ranks (a GPU's rates are given, or the defaults; --trials measures them):
// each transformer layer shape a layout gives a rank is timed forward and backward on one thread
// (the launcher runs a rank on one), shared between the ranks a node has more of than cores;
// Gloo's reduce-scatter + all-gather and a one-element allreduce among the node's ranks; one large
// copy for the memory bandwidth.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/estimator/estimator.h"
#include "engine/planner/probe.h"

namespace tessera::planner {

struct Rate {
  double value = 0;
  std::string source;  // "given", "measured now (...)", "cached (<file>, <date>)", "default (<what>)"
};

class Calibration {
 public:
  Rate tflops;               // per GPU, or per core for CPU ranks; the compute dtype, large matrix products
  Rate intra_node_gbps;      // collective bus bandwidth inside a node, GB/s
  Rate inter_node_gbps;      // ... per rank when a group spans nodes
  Rate host_memory_gbps;     // per node
  Rate device_memory_gbps;   // per rank: the optimizer step's bandwidth (GPU HBM; CPU ranks: the host's share)
  Rate pcie_gbps;            // host <-> device per rank (offload)
  Rate nvme_gbps;            // per node
  Rate collective_latency_us;  // per collective call
  // The share of an overlapped collective's time the step still pays beyond the compute it hides
  // behind (ZeRO-3's prefetched gathers and its reduce-scatters in the backward): 0 on GPUs (NCCL
  // runs on its own channels); CPU ranks: Gloo's copies and sums run on the cores the ranks share.
  Rate overlap_exposed;
  std::string device = "gpu";
  int ranks_per_node = 1;    // the ranks sharing a node's cores, memory and disk
  // The nodes are emulated hosts of this one machine (scripts/cluster.sh: a host is a network
  // stack): ranks_per_node counts every rank, as they all share its cores, memory and disk.
  bool emulated_hosts = false;
  int cores_per_node = 0;    // CPU ranks: the cores they share
  std::string precision = "fp32";

  // One layer's forward + backward on one rank at `shape` with a core (GPU) to itself, timed by the
  // probe (once per shape, then remembered and cached); nullopt when the probe is off (the FLOP
  // model is used). Sharing cores is the step-cost model's (step_cost.cpp).
  std::optional<double> layer_seconds(const LayerShape& shape) const;
  // Times the shapes the probe has not timed yet, all together in interleaved passes (probe.h's
  // time_layers), so layer_seconds finds them; nothing when the probe is off.
  void time_layers(const std::vector<LayerShape>& shapes) const;
  // A linear layer's forward + backward ([rows × k]·[k × n] and its two gradient products): timed
  // when the probe is on, else the roofline: each product the larger of 2·rows·k·n / tflops and
  // its operands' and result's bytes / device_memory_gbps (Williams et al. 2009).
  double linear_seconds(int64_t rows, int64_t k, int64_t n) const;
  // Roofline seconds of `flops` arithmetic moving `bytes` (no probe).
  double roofline_seconds(double flops, double bytes) const;
  bool probes() const { return probe_; }

  enum class Collective { reduce_scatter, all_gather, all_reduce };
  // Seconds for one `kind` over `ranks` ranks of a `bytes` buffer (the full one: the reduce-
  // scatter's input, the all-gather's output): the latency plus the ring's bytes ((n−1)/n of the
  // buffer, twice for the allreduce) over the bus bandwidth: inter_node_gbps when the group spans
  // nodes; inside a node the probe's rate for that collective when it timed one, else intra_node_gbps.
  // `between_compute`: the collective sits between compute segments of every rank (tensor
  // parallelism's, context parallelism's, the experts' all-to-alls): on CPU ranks sharing cores
  // its latency is the probe's for a group of that size timed that way (probe.h synced_latency_us).
  double collective_seconds(Collective kind, double bytes, int ranks, bool spans_nodes,
                            bool between_compute = false) const;
  // The latency part of it.
  double latency_seconds(int ranks, bool spans_nodes, bool between_compute) const;
  // The share of a core one CPU rank gets (1 on GPUs and when the node has a core per rank).
  double core_share() const;

  nlohmann::json to_json() const;
  std::string describe() const;  // one line per rate: value and source
  // Writes what the probe timed to the cache (the planner calls it after planning).
  void save() const;

  // From the estimator's resolved hardware (its rates, defaults filled in) and the request (which
  // rates it gave; cores_per_node, collective_latency_us, device_memory_bw). CPU ranks: `measure`
  // runs the probe now (and caches it); otherwise a cached probe of this CPU and precision is used
  // when there is one, and shapes it lacks are timed now.
  static Calibration from(const Hardware& resolved, const std::string& precision, const nlohmann::json& request,
                          bool measure, const std::string& cache_path);

 private:
  bool probe_ = false;
  std::string cache_path_, cache_key_;
  std::string layer_source_;  // "measured now" or "cached (...)"
  double collective_gbps_[3] = {0, 0, 0};                  // by Collective; 0: intra_node_gbps
  std::map<int, double> synced_latency_us_;                // group size -> us (probe.h); empty: the latency
  mutable std::map<std::string, double> layers_;          // LayerShape::key() -> seconds
  mutable std::map<std::string, double> linears_;         // "rows,k,n" -> seconds
  mutable int timed_now_ = 0;
};

// The links between nodes as `tessera probe-link` measured them across hosts (the slowest rank's
// reduce-scatter + all-gather bus bandwidth; `across` says over what), written to the cache's
// "inter_node" entry, which Calibration::from then reads for CPU ranks' inter_node_gbps unless the
// request gives inter_node_bw. False when the cache cannot be written.
bool save_inter_node_probe(const std::string& cache_path, const LinkProbe& probe, const std::string& across);

// ~/.cache/tessera/calibration.json ($TESSERA_CACHE_DIR overrides the folder).
std::string default_calibration_cache();

// The CPU's model name (/proc/cpuinfo), "unknown" elsewhere: a cached probe is for one CPU.
std::string cpu_model_name();
int online_cores();

}  // namespace tessera::planner
