// DeepSpeed's elastic batch layout (engine/config/elasticity.h), step by step as elasticity.py's
// version 0.1 and 0.2 compute it, its corner cases included (a base above the maximum stays a
// candidate; a node count of 0 means the default).
#include "engine/config/elasticity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace tessera {
namespace {

// The 38 smallest highly composite numbers (batches up to 720,720 × base), as DeepSpeed lists them.
constexpr int64_t kHighlyComposite[] = {1,      2,      4,      6,      12,     24,     36,     48,     60,     120,
                                        180,    240,    360,    720,    840,    1260,   1680,   2520,   5040,   7560,
                                        10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440,  83160,  110880,
                                        166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Each base scaled by the largest highly composite number that keeps it within `max_batch`.
std::set<int64_t> candidate_batches(const std::vector<int64_t>& bases, int64_t max_batch) {
  std::set<int64_t> out;
  for (int64_t base : bases) {
    int64_t batch = base;
    for (int64_t h : kHighlyComposite) {
      if (base * h > max_batch) break;
      batch = base * h;
    }
    out.insert(batch);
  }
  return out;
}

// The world sizes in [lo, hi] that `batch` splits into at some micro-batch size: every divisor of
// batch / micro for each micro that divides it.
std::vector<int64_t> valid_sizes(int64_t batch, const std::vector<int64_t>& micro, int64_t lo, int64_t hi) {
  std::set<int64_t> sizes;
  for (int64_t mb : micro) {
    if (batch % mb != 0) continue;
    const int64_t most = batch / mb;
    if (most >= lo && most <= hi) sizes.insert(most);
    for (int64_t i = 1; i <= most / 2; ++i)
      if (most % i == 0 && i >= lo && i <= hi) sizes.insert(i);
  }
  return {sizes.begin(), sizes.end()};
}

struct Layout {
  int64_t batch = 0;
  std::vector<int64_t> valid;
};

// Version 0.1: the candidate valid at the most world sizes (ties by prefer_larger).
Layout layout_v01(const std::vector<int64_t>& micro, int64_t max_batch, int64_t min_size, int64_t max_size,
                  bool prefer_larger) {
  const int64_t smallest = *std::min_element(micro.begin(), micro.end());
  if (min_size == 0) min_size = 1;
  if (max_size == 0) max_size = max_batch / smallest;
  for (int64_t mb : micro)
    if (mb > max_batch)
      throw ElasticityError("elasticity.micro_batch_sizes", "micro batch size " + std::to_string(mb) +
                                                                " is above the largest batch " + std::to_string(max_batch) +
                                                                " (elasticity.max_train_batch_size per node's data ranks)");
  int64_t lcm = 1;
  for (int64_t mb : micro) lcm = std::lcm(lcm, mb);
  std::vector<int64_t> bases = micro;
  bases.push_back(lcm);
  Layout best{smallest, {}};
  size_t best_count = 0;
  for (int64_t batch : candidate_batches(bases, max_batch)) {
    std::vector<int64_t> valid = valid_sizes(batch, micro, min_size, max_size);
    const bool tie_wins = prefer_larger ? batch > best.batch : batch < best.batch;
    if (valid.size() > best_count || (valid.size() == best_count && tie_wins)) {
      best_count = valid.size();
      best = {batch, std::move(valid)};
    }
  }
  return best;
}

// Version 0.2: version 0.1 over nodes, each num_gpus_per_node / model_parallel_size data ranks;
// a size that is not among them gets the batch a micro-batch size fills within the maximum.
Layout layout_v02(const ElasticityConfig& e, int64_t size) {
  if (e.num_gpus_per_node % e.model_parallel_size != 0)
    throw ElasticityError("elasticity.num_gpus_per_node", "num_gpus_per_node " + std::to_string(e.num_gpus_per_node) +
                                                              " is not a multiple of model_parallel_size " +
                                                              std::to_string(e.model_parallel_size));
  const int64_t per_node = e.num_gpus_per_node / e.model_parallel_size;
  const auto max_batch = static_cast<int64_t>(double(*e.max_train_batch_size) / double(per_node));
  const auto min_nodes = static_cast<int64_t>(double(e.min_gpus) / double(e.num_gpus_per_node));
  const auto max_nodes = static_cast<int64_t>(double(e.max_gpus) / double(e.num_gpus_per_node));
  Layout nodes = layout_v01(e.micro_batch_sizes, max_batch, min_nodes, max_nodes, e.prefer_larger_batch);
  Layout out{nodes.batch * per_node, {}};
  for (int64_t n : nodes.valid) out.valid.push_back(n * per_node);
  if (std::find(out.valid.begin(), out.valid.end(), size / e.model_parallel_size) != out.valid.end()) return out;
  const double dp = double(size) / double(e.num_gpus_per_node) * double(per_node);
  std::vector<double> candidates;
  for (int64_t mb : e.micro_batch_sizes) {
    const double least = double(mb) * dp;
    candidates.push_back(std::floor(double(*e.max_train_batch_size) / least) * least);
  }
  const double chosen = e.prefer_larger_batch ? *std::max_element(candidates.begin(), candidates.end())
                                              : *std::min_element(candidates.begin(), candidates.end());
  return {static_cast<int64_t>(chosen), {static_cast<int64_t>(dp)}};
}

}  // namespace

ElasticBatch compute_elastic_batch(const ElasticityConfig& e, int64_t size) {
  if (!e.max_train_batch_size)
    throw ElasticityError("elasticity.max_train_batch_size", "elasticity.enabled needs max_train_batch_size");
  if (e.micro_batch_sizes.empty())
    throw ElasticityError("elasticity.micro_batch_sizes", "elasticity.enabled needs micro_batch_sizes, a list of "
                                                          "positive integers");
  for (int64_t mb : e.micro_batch_sizes)
    if (mb < 1)
      throw ElasticityError("elasticity.micro_batch_sizes", "found " + list(e.micro_batch_sizes) +
                                                                ", expected positive integers");
  if (e.min_gpus > e.max_gpus)
    throw ElasticityError("elasticity.min_gpus", "min_gpus " + std::to_string(e.min_gpus) + " is above max_gpus " +
                                                     std::to_string(e.max_gpus));
  if (e.version > 0.2)
    throw ElasticityError("elasticity.version", "version " + std::to_string(e.version).substr(0, 4) +
                                                    ": DeepSpeed's elasticity goes up to 0.2");
  if (e.version != 0.1 && e.version != 0.2)
    throw ElasticityError("elasticity.version", "expected 0.1 or 0.2");
  if (e.model_parallel_size > 1 && e.version != 0.2)
    throw ElasticityError("elasticity.model_parallel_size", "model_parallel_size " +
                                                                std::to_string(e.model_parallel_size) +
                                                                " needs elasticity version 0.2");
  const Layout layout = e.version == 0.1 ? layout_v01(e.micro_batch_sizes, *e.max_train_batch_size, e.min_gpus,
                                                      e.max_gpus, e.prefer_larger_batch)
                                         : layout_v02(e, size);
  if (std::find(layout.valid.begin(), layout.valid.end(), size) == layout.valid.end())
    throw ElasticityError("elasticity", "the data-parallel size " + std::to_string(size) + " is not one the elastic "
                                        "batch of " + std::to_string(layout.batch) + " splits into: valid sizes " +
                                        list(layout.valid));
  ElasticBatch out;
  out.train_batch_size = layout.batch;
  out.valid_sizes = layout.valid;
  std::vector<int64_t> micro = e.micro_batch_sizes;
  std::sort(micro.rbegin(), micro.rend());
  for (int64_t mb : micro)
    if (layout.batch / size % mb == 0) {
      out.micro_batch = mb;
      break;
    }
  if (out.micro_batch == 0)
    throw ElasticityError("elasticity.micro_batch_sizes", "none of " + list(e.micro_batch_sizes) + " divides " +
                                                              std::to_string(layout.batch / size) + ", the share of "
                                                              "each of " + std::to_string(size) + " ranks");
  out.gradient_accumulation_steps = layout.batch / (out.micro_batch * size);
  return out;
}

}  // namespace tessera
