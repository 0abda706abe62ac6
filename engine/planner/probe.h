// What the planner's calibration times on this machine (CPU ranks): a transformer layer's forward
// and backward at the shapes a layout gives one rank, matrix products, the memory bandwidth, and
// Gloo's collectives among as many ranks as the node runs. Each probe is short (a warm-up, then
// the best of a few) and runs on one thread per rank, as the launcher runs ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera {
class Communicator;
}

namespace tessera::planner {

// One rank's share of one transformer layer (GPT-2's or Llama's block) for one micro-batch.
struct LayerShape {
  int64_t micro = 1;
  int64_t tokens = 0;   // this rank's positions of each sequence (seq_len / cp)
  int64_t seq_len = 0;  // the keys each query attends to (the whole sequence)
  int64_t hidden = 0;
  int64_t heads = 0;    // attention heads this rank computes (heads / (tp · cp))
  int64_t kv_heads = 0; // key/value heads among them
  int64_t ffn = 0;      // this rank's columns of the MLP (ffn / tp)
  int64_t linear_in = 0;   // this rank's q, k, v columns ((h + 2·kv) / tp)
  int64_t linear_out = 0;  // this rank's rows of the output projection (h / tp)
  bool swiglu = false;
  bool rmsnorm = false;
  std::string key() const;  // for the cache
};

// Seconds for each shape's layer forward and backward on one thread (autograd through ATen's
// layer_norm, matrix products, scaled_dot_product_attention and the MLP's activation; collectives
// excluded), run by `together` threads at once (a node's ranks running together contend for its
// cores, caches and memory: on the 2-core VM 4 ranks took 1.9x to 2.8x a rank alone, by shape), on
// the first `cores` of this machine's cores when it has more (a node smaller than this machine,
// e.g. an emulated host of scripts/cluster.sh). A round lasts from the threads' release to the
// last one done; five passes interleaved over all the shapes (a machine whose speed drifts moves
// them alike), the median round of each: what the planner asks for all its layouts at once.
std::vector<double> time_layers(const std::vector<LayerShape>& shapes, at::ScalarType dtype, int together = 1,
                                int cores = 0);

// Seconds for [rows × k]·[k × n] and the two products of its backward (input and weight gradients).
double time_linear(int64_t rows, int64_t k, int64_t n, at::ScalarType dtype);

// The best of three copies of 256 MiB, read and written, by `threads` threads at once (each its
// share): GB/s in all, what the node's ranks stepping their optimizers together can move. (On the
// 2-core VM one thread copied 24 GB/s and two together 25-27: the memory is the limit there; on
// a host with more cores one core is not.)
double time_copy_gbps(int threads = 1);

// Gloo among `ranks` ranks (processes forked from this one over a file store, TCP on loopback,
// as the launcher's ranks on one host talk): the bus bandwidth of a reduce-scatter plus an all-gather of `bytes`
// (ZeRO's pair, ring-equivalent bytes 2(n−1)/n), of each of the three alone (NCCL's convention:
// (n−1)/n of the buffer for the first two, 2(n−1)/n for the allreduce; Gloo's three are not one
// ring at one speed: its allreduce took about the reduce-scatter's time on this project's VM), and
// the latency of a one-element allreduce among idle ranks; and, by group size (2, 4, ... dividing
// the node's ranks), that allreduce's latency when it sits between compute segments on every rank
// (synced_latency_us: tensor parallelism's collectives, where ranks sharing cores arrive at
// different times).
struct LinkProbe {
  double bus_gbps = 0;
  double latency_us = 0;
  double reduce_scatter_gbps = 0, all_gather_gbps = 0, all_reduce_gbps = 0;  // 0: not timed (an old cache)
  std::map<int, double> synced_latency_us;  // group size -> us; empty: not timed (across hosts, an old cache)
};
LinkProbe time_gloo(int ranks, int64_t bytes, int cores = 0);  // cores: as time_layer's

// This rank's view of the same probe over `comm` (every rank of it calls this together): what
// time_gloo runs in each of its processes, and `tessera probe-link` in each launched rank across
// hosts (engine/cli/probe_link_command.cpp).
LinkProbe time_link(Communicator& comm, int64_t bytes);

// The job is as fast as its slowest rank: the lowest of each rate and the highest latency.
LinkProbe slowest_of(const std::vector<LinkProbe>& ranks);

}  // namespace tessera::planner
