#include "parallel/pipeline/partition.h"

#include <algorithm>
#include <numeric>
#include <regex>
#include <stdexcept>

namespace tessera::pipeline {

namespace {

// Can `weights` be cut into at most `parts` contiguous pieces, none heavier than `limit`?
bool fits(const std::vector<int64_t>& weights, int parts, int64_t limit) {
  int used = 1;
  int64_t sum = 0;
  for (int64_t w : weights) {
    if (w > limit) return false;
    if (sum + w > limit) {
      ++used;
      sum = 0;
    }
    sum += w;
  }
  return used <= parts;
}

}  // namespace

std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  if (parts < 1 || parts > n)
    throw std::invalid_argument("partition_balanced: " + std::to_string(parts) + " parts of " + std::to_string(n) + " layers");
  // The smallest limit that fits (binary search: fits() is monotone in the limit) ...
  int64_t low = *std::max_element(weights.begin(), weights.end());
  int64_t high = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (fits(weights, parts, mid)) high = mid;
    else low = mid + 1;
  }
  // ... then fill each part up to it greedily, leaving at least one layer for each part after it.
  std::vector<int> bounds{0};
  int next = 0;
  for (int part = 0; part < parts; ++part) {
    const int must_leave = parts - part - 1;
    int64_t sum = weights[next];
    int end = next + 1;
    while (end < n - must_leave && sum + weights[end] <= low) sum += weights[end++];
    if (part == parts - 1) end = n;
    bounds.push_back(end);
    next = end;
  }
  return bounds;
}

namespace {

// "type:REGEX": 1 for each layer whose type matches (case-insensitive), 0 for the others; none
// matching is an error naming the types. Empty for the other methods.
std::vector<int64_t> type_weights(const std::vector<LayerInfo>& layers, const std::string& method) {
  std::vector<int64_t> weights;
  if (method.rfind("type:", 0) != 0 || method.size() <= 5) return weights;
  const std::regex pattern(method.substr(5), std::regex::icase);
  for (const LayerInfo& l : layers) weights.push_back(std::regex_search(l.type, pattern) ? 1 : 0);
  if (std::accumulate(weights.begin(), weights.end(), int64_t{0}) == 0) {
    std::string types;
    for (const LayerInfo& l : layers) types += (types.empty() ? "" : ", ") + l.type;
    throw std::invalid_argument("pipeline.partition_method: \"" + method + "\" matches none of the layer types (" + types + ")");
  }
  return weights;
}

}  // namespace

std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method) {
  const int n = static_cast<int>(layers.size());
  if (stages < 1) throw std::invalid_argument("pipeline.stages: expected >= 1, got " + std::to_string(stages));
  if (stages > n)
    throw std::invalid_argument("pipeline.stages: " + std::to_string(stages) + " stages for a model of " + std::to_string(n) +
                                " layers; every stage needs at least one layer (expected pipeline.stages <= " +
                                std::to_string(n) + ")");
  if (method == "uniform") {
    std::vector<int> bounds{0};
    for (int s = 0; s < stages; ++s) bounds.push_back(bounds.back() + n / stages + (s < n % stages ? 1 : 0));
    return bounds;
  }
  std::vector<int64_t> weights = type_weights(layers, method);
  if (method == "parameters") {
    for (const LayerInfo& l : layers) weights.push_back(l.parameters);
  } else if (weights.empty()) {
    throw std::invalid_argument("pipeline.partition_method: expected \"parameters\", \"uniform\" or \"type:<regex>\", got \"" +
                                method + "\"");
  }
  return partition_balanced(weights, stages);
}

std::vector<int> partition_chunks(const std::vector<LayerInfo>& layers, int stages, int chunks, const std::string& method) {
  if (chunks < 1) throw std::invalid_argument("pipeline.virtual_stages: expected >= 1, got " + std::to_string(chunks));
  if (chunks == 1) return partition_layers(layers, stages, method);
  const int n = static_cast<int>(layers.size()), parts = stages * chunks;
  const std::string sizes = "pipeline.virtual_stages " + std::to_string(chunks) + " x pipeline.stages " + std::to_string(stages) +
                            " = " + std::to_string(parts) + " model chunks";
  if (parts > n)
    throw std::invalid_argument("pipeline.virtual_stages: " + sizes + " for a model of " + std::to_string(n) +
                                " layers; every chunk needs at least one layer");
  // The interleaved schedule assumes chunks of equal cost: the layers it counts must divide evenly.
  const std::vector<int64_t> matched = type_weights(layers, method);
  const int counted = matched.empty() ? n : static_cast<int>(std::accumulate(matched.begin(), matched.end(), int64_t{0}));
  if (method != "parameters" && counted % parts != 0)
    throw std::invalid_argument("pipeline.virtual_stages: " + sizes + " do not divide the " + std::to_string(counted) +
                                (counted == n ? " layers" : " layers matching \"" + method + "\"") +
                                " evenly (partition_method \"" + method + "\"); choose virtual_stages so that stages x "
                                "virtual_stages divides them, or partition_method \"parameters\"");
  return partition_layers(layers, parts, method);
}

std::vector<std::pair<int, int>> stage_layer_ranges(const std::vector<int>& bounds, int stage, int stages, Placement placement) {
  const int chunks = (static_cast<int>(bounds.size()) - 1) / stages;
  const ChunkLayout layout{stages, chunks, placement};
  std::vector<std::pair<int, int>> ranges;
  for (int c = 0; c < chunks; ++c) {
    const int g = layout.model_chunk(stage, c);
    ranges.push_back({bounds[g], bounds[g + 1]});
  }
  return ranges;
}

std::string describe_partition(const std::vector<LayerInfo>& layers, const std::vector<int>& bounds, int stages,
                               Placement placement) {
  std::string text;
  const bool chunked = stages > 0 && static_cast<int>(bounds.size()) - 1 > stages;
  const ChunkLayout layout{std::max(stages, 1), (static_cast<int>(bounds.size()) - 1) / std::max(stages, 1), placement};
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    int64_t params = 0;
    std::string names;
    for (int i = bounds[s]; i < bounds[s + 1]; ++i) {
      params += layers[i].parameters;
      names += (names.empty() ? "" : " ") + std::to_string(i) + ":" + layers[i].type;
    }
    const std::string holder = std::to_string(layout.place(static_cast<int>(s)).first);
    text += (chunked ? "chunk " + std::to_string(s) + " (stage " + holder + ")" : "stage " + std::to_string(s)) +
            ": layers " + std::to_string(bounds[s]) + "-" + std::to_string(bounds[s + 1] - 1) +
            " (" + std::to_string(params) + " parameters): " + names + "\n";
  }
  return text;
}

}  // namespace tessera::pipeline
